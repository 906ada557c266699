package lease

// FakeLease returns a Lease that no store issued, for tests of the callers
// of a Store (a fake shared limit); Store.Release ignores its member.
func FakeLease(backend, member string) Lease { return Lease{backend: backend, member: member} }
