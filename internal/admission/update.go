package admission

import "fmt"

// Update applies a new set of backends and pools to a running scheduler
// (a configuration reload) without losing anything it holds:
//
//   - a backend or pool of the same name is changed in place: its slots in
//     flight and its waiters stay, and the waiters are served under the new
//     limits at once (a larger max_concurrency hands them slots now; a
//     smaller one hands out no more until the backend is under it; a smaller
//     max_queue refuses newcomers until the queue is under it, evicting
//     nobody);
//   - a backend or pool the new set no longer has is retired: no route
//     reaches it any more, but its slots in flight end as usual and its
//     waiters keep their place until they are served on its backends, time
//     out or leave — a request is served by the configuration it came in
//     under;
//   - a new backend or pool starts empty; one that comes back by name is
//     revived with its counts.
//
// With a Shared limit, every lease request carries the backend's current
// MaxConcurrency, so a new limit holds across replicas as each replica
// reloads. The set is checked before anything changes: on error nothing did.
func (s *Scheduler) Update(c Config) error {
	known := map[string]BackendSpec{}
	for _, bs := range c.Backends {
		if _, dup := known[bs.Name]; dup {
			return fmt.Errorf("admission: duplicate backend %q", bs.Name)
		}
		known[bs.Name] = bs
	}
	pools := map[string]bool{}
	for _, ps := range c.Pools {
		if pools[ps.Name] {
			return fmt.Errorf("admission: duplicate pool %q", ps.Name)
		}
		pools[ps.Name] = true
		if len(ps.Backends) == 0 {
			return fmt.Errorf("admission: pool %q has no backend", ps.Name)
		}
		for _, n := range ps.Backends {
			if _, ok := known[n]; !ok {
				return fmt.Errorf("admission: pool %q: unknown backend %q", ps.Name, n)
			}
		}
	}
	s.mu.Lock()
	for _, ps := range c.Pools {
		if p := s.poolsBy[ps.Name]; p != nil && !sameNames(p.names, ps.Backends) {
			s.mu.Unlock()
			return fmt.Errorf("admission: pool %q: its backends cannot change (%v → %v)", ps.Name, p.names, ps.Backends)
		}
	}
	for _, b := range s.backends {
		b.retired = true
	}
	for _, bs := range c.Backends {
		b := s.byName[bs.Name]
		if b == nil {
			b = &backend{name: bs.Name}
			s.backends = append(s.backends, b)
			s.byName[b.name] = b
		}
		b.max, b.weight, b.up, b.retired = max(bs.MaxConcurrency, 1), validWeight(bs.Weight), bs.Up, false
	}
	for _, p := range s.pools {
		p.retired = true
	}
	for _, ps := range c.Pools {
		p := s.poolsBy[ps.Name]
		if p == nil {
			p = &Pool{s: s, name: ps.Name}
			for _, name := range ps.Backends {
				b := s.byName[name]
				p.backends = append(p.backends, b)
				p.names = append(p.names, name)
				b.pools = append(b.pools, p)
			}
			s.pools = append(s.pools, p)
			s.poolsBy[p.name] = p
		}
		p.maxQueue, p.timeout, p.retired = max(ps.MaxQueue, 0), max(ps.QueueTimeout, 0), false
	}
	for _, p := range s.pools {
		p.capacity = 0
		for _, b := range p.backends {
			p.capacity += b.max
		}
	}
	local := s.localLocked()
	if local {
		// A larger limit frees slots for the requests that wait now.
		for _, p := range s.pools {
			if p.head != nil {
				s.dispatchLocked(p)
			}
		}
	}
	for _, b := range s.backends {
		s.changedLocked(b)
	}
	s.mu.Unlock()
	if !local {
		s.poke()
	}
	return nil
}

func sameNames(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
