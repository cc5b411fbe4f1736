package leaseproxy

import (
	"context"
	"encoding/json"
	"net/http"
	"time"
)

// FleetSpec is what a fleet shares: PUT /v1/fleets/{fleet}.
type FleetSpec struct {
	// Resources are the wanted resources (ordinary /v1 names).
	Resources []string
	// Drain is how long a member has to release a resource moved away from it (0: the
	// service's default).
	Drain time.Duration
	// MaxMoves bounds the hand-offs in flight at once (0: the service's default).
	MaxMoves int
}

// FleetView is a fleet as it stands, without secrets (GET /v1/fleets/{fleet}).
type FleetView struct {
	Fleet     string        `json:"fleet"`
	Resources []string      `json:"resources"`
	Revision  string        `json:"revision"`
	Members   []FleetMember `json:"members"`
	// Unassigned are the resources no member holds now.
	Unassigned []string `json:"unassigned"`
}

// FleetMember is a member as a reader of the fleet sees it.
type FleetMember struct {
	Member    string   `json:"member"`
	Weight    int      `json:"weight"`
	State     string   `json:"state"`
	Held      []string `json:"held"`
	Releasing []string `json:"releasing"`
}

// PutFleet creates or changes fleet (the caller needs acquire on every resource).
func (c *Client) PutFleet(ctx context.Context, fleet string, spec FleetSpec) error {
	body := map[string]any{"resources": spec.Resources}
	if spec.Resources == nil {
		body["resources"] = []string{}
	}
	if spec.Drain > 0 {
		body["drain_ms"] = spec.Drain.Milliseconds()
	}
	if spec.MaxMoves > 0 {
		body["max_moves"] = spec.MaxMoves
	}
	_, err := c.do(ctx, call{method: http.MethodPut, path: fleetPath(fleet), body: body})
	return err
}

// GetFleet is fleet as it stands; ErrNotFound when there is none.
func (c *Client) GetFleet(ctx context.Context, fleet string) (*FleetView, error) {
	a, err := c.do(ctx, call{method: http.MethodGet, path: fleetPath(fleet)})
	if err != nil {
		return nil, err
	}
	var v FleetView
	if err := json.Unmarshal(a.body, &v); err != nil || v.Fleet == "" {
		return nil, protocolErr(a.status, "not a fleet: %s", excerpt(a.body))
	}
	return &v, nil
}

// DeleteFleet ends fleet: its members' grants of its resources are released.
func (c *Client) DeleteFleet(ctx context.Context, fleet string) error {
	_, err := c.do(ctx, call{method: http.MethodDelete, path: fleetPath(fleet)})
	return err
}

// EvictMember evicts member from fleet (an operator's call): its grants end at once.
func (c *Client) EvictMember(ctx context.Context, fleet, member string) error {
	_, err := c.do(ctx, call{method: http.MethodDelete, path: fleetPath(fleet) + "/members/" + segment(member)})
	return err
}
