// Package leaseproxy is the Go client of lease-proxy: exclusive, time-bounded ownership of
// named resources, with fencing tokens, over the proxy's HTTP API (/v1).
//
// A Lease (Client.Acquire, Client.WithLease) renews itself and is lost — its Context
// cancelled, Lost closed, Err a *LostError saying why — the moment the client learns it no
// longer holds it: a refused renewal, the server's event on the client's one shared
// /v1/watch stream, or its stop-by deadline (acquire start + lifetime − safety margin on the
// monotonic clock, moved on by each renewal) passing while the server cannot be reached.
//
// Its fencing token reaches storage without code of the application's: Transport adds
// Fencing-Token and Fencing-Resource to HTTP requests whose context carries the lease, and
// Admit runs fencing.admit in the caller's database/sql transaction. TestMode injects losses,
// late and failed renewals and token refusals, so an application's tests run their on-lost
// paths. Sessions (Client.OpenSession) hold many resources on one heartbeat; Client.Watch is
// the event stream.
//
// Go 1.19 has no context.Cause: Lease.Err (or Lease.Cause, or the package's Cause(ctx)) gives
// the reason a lease's context was cancelled.
//
// Only the standard library is used.
package leaseproxy
