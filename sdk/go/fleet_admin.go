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
	Fleet     string
	Resources []string
	// Drain is how long a member has to release a resource moved away from it.
	Drain time.Duration
	// MaxMoves bounds the hand-offs in flight at once.
	MaxMoves int
	// Revision is the etcd revision the fleet was read at (a decimal string).
	Revision string
	Members  []FleetMember
	// Unassigned are the resources no member holds now.
	Unassigned []string
}

// fleetAnswer is GET /v1/fleets/{fleet}'s body.
type fleetAnswer struct {
	Fleet      *string       `json:"fleet"`
	Resources  []string      `json:"resources"`
	DrainMs    *int64        `json:"drain_ms"`
	MaxMoves   *int          `json:"max_moves"`
	Revision   *string       `json:"revision"`
	Members    []FleetMember `json:"members"`
	Unassigned []string      `json:"unassigned"`
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

// GetFleet is fleet as it stands (the caller needs read on every resource); ErrNotFound when
// there is none (404 no-fleet).
func (c *Client) GetFleet(ctx context.Context, fleet string) (*FleetView, error) {
	a, err := c.do(ctx, call{method: http.MethodGet, path: fleetPath(fleet)})
	if err != nil {
		return nil, err
	}
	var f fleetAnswer
	if err := json.Unmarshal(a.body, &f); err != nil || f.Fleet == nil || *f.Fleet == "" ||
		f.DrainMs == nil || *f.DrainMs < 0 || f.MaxMoves == nil || f.Revision == nil {
		return nil, protocolErr(a.status, "not a fleet: %s", excerpt(a.body))
	}
	return &FleetView{Fleet: *f.Fleet, Resources: f.Resources, Drain: time.Duration(*f.DrainMs) * time.Millisecond,
		MaxMoves: *f.MaxMoves, Revision: *f.Revision, Members: f.Members, Unassigned: f.Unassigned}, nil
}

// DeleteFleet ends fleet: every grant it made is released before it returns.
func (c *Client) DeleteFleet(ctx context.Context, fleet string) error {
	_, err := c.do(ctx, call{method: http.MethodDelete, path: fleetPath(fleet)})
	return err
}

// DrainMember drains member as an operator (no secret; the caller needs acquire on every
// resource of the fleet): it hands off everything and takes nothing new. A member drains itself
// with Member.Drain. ErrNotFound when there is no such fleet or member.
func (c *Client) DrainMember(ctx context.Context, fleet, member string) error {
	_, err := c.do(ctx, call{method: http.MethodPost, path: fleetPath(fleet) + "/members/" + segment(member) + "/drain"})
	return err
}

// EvictMember evicts member from fleet (an operator's call: acquire on every resource of the
// fleet): its grants end at once, and it gets nothing until it joins again. ErrNotFound when
// there is no such fleet or member.
func (c *Client) EvictMember(ctx context.Context, fleet, member string) error {
	_, err := c.do(ctx, call{method: http.MethodDelete, path: fleetPath(fleet) + "/members/" + segment(member)})
	return err
}
