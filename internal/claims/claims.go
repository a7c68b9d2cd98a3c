// Package claims records which owner on the sled holds which ids and
// underlay addresses, so that no two owners (the sled config's zones, a VMM,
// the sled itself) are given the same one: link names and host routes
// derive from them, and a second holder would take the first one's.
package claims

import (
	"fmt"
	"net/netip"
	"strings"
	"sync"
)

// Key is one thing an owner can hold: a zone or VMM id, or an underlay
// address. Keys of one kind collide; an id never collides with an address.
type Key struct {
	id   string
	addr netip.Addr
}

// ID is the key of a zone or VMM id (letter case does not tell ids apart:
// the names derived from them are lower case).
func ID(id string) Key { return Key{id: strings.ToLower(id)} }

// Addr is the key of an underlay address.
func Addr(a netip.Addr) Key { return Key{addr: a.Unmap().WithZone("")} }

func (k Key) String() string {
	if k.id != "" {
		return k.id
	}
	return k.addr.String()
}

// Claim is one key an owner wants, with the words a refusal is made of.
type Claim struct {
	Key Key
	// Holder names what holds the key: "zone oxz_crucible_<id> (id <id>)",
	// "VMM <id>", "the sled".
	Holder string
	// As says what the key is to its holder: "id", "underlay address",
	// "gz_address", "propolis_addr".
	As string
}

// ConflictError is a claim refused because another owner holds its key.
type ConflictError struct {
	Want Claim // the claim refused
	Held Claim // the claim holding its key
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("%s: %s %s is the %s of %s", e.Want.Holder, e.Want.As, e.Want.Key, e.Held.As, e.Held.Holder)
}

// Set is the sled's claims. Its methods only touch memory, under a short
// mutex: callers may hold their own locks across them.
type Set struct {
	mu   sync.Mutex
	held map[Key]entry // guarded by mu
}

type entry struct {
	owner string
	claim Claim
}

// New returns an empty set.
func New() *Set { return &Set{held: map[Key]entry{}} }

// Claim gives owner every claim of cs, in addition to what it holds, or,
// when another owner holds any of their keys, nothing: the error is then a
// *ConflictError naming the first such claim of cs and its holder. undo puts
// owner back to what it held before (an owner's own calls are its to order:
// undo is meant to come before the owner's next call).
func (s *Set) Claim(owner string, cs []Claim) (undo func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range cs {
		if e, ok := s.held[c.Key]; ok && e.owner != owner {
			return func() {}, &ConflictError{Want: c, Held: e.claim}
		}
	}
	prev := map[Key]*entry{}
	for _, c := range cs {
		if _, seen := prev[c.Key]; !seen {
			if e, ok := s.held[c.Key]; ok {
				prev[c.Key] = &e
			} else {
				prev[c.Key] = nil
			}
		}
		s.held[c.Key] = entry{owner: owner, claim: c}
	}
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		for k, e := range prev {
			if e == nil {
				delete(s.held, k)
			} else {
				s.held[k] = *e
			}
		}
	}, nil
}

// ClaimFree is Claim for what already exists (found at start): owner gets
// every claim of cs whose key is free or its own, and a conflict is
// returned for each of the others, to be reported.
func (s *Set) ClaimFree(owner string, cs []Claim) []*ConflictError {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*ConflictError
	for _, c := range cs {
		if e, ok := s.held[c.Key]; ok && e.owner != owner {
			out = append(out, &ConflictError{Want: c, Held: e.claim})
			continue
		}
		s.held[c.Key] = entry{owner: owner, claim: c}
	}
	return out
}

// Keep leaves owner holding only those of its keys that are in cs (it
// gives owner no key it did not hold): how an owner that claimed a new set
// on top of its old one settles on the new one.
func (s *Set) Keep(owner string, cs []Claim) {
	keep := make(map[Key]Claim, len(cs))
	for _, c := range cs {
		keep[c.Key] = c
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, e := range s.held {
		if e.owner != owner {
			continue
		}
		if c, ok := keep[k]; ok {
			s.held[k] = entry{owner: owner, claim: c}
		} else {
			delete(s.held, k)
		}
	}
}

// Release gives up everything owner holds.
func (s *Set) Release(owner string) { s.Keep(owner, nil) }

// Holder returns who holds k, if anyone.
func (s *Set) Holder(k Key) (owner string, c Claim, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.held[k]
	return e.owner, e.claim, ok
}
