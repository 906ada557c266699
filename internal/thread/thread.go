// Package thread reads a conversation stored as a tree. Each message has a
// parent (none for the first); editing a message or regenerating an answer
// adds a sibling — a version — instead of replacing it. What a person sees,
// and what the engine is sent, is one path from a root to a leaf: the path
// shown. The package only reads: it is given every message of a
// conversation (ids sort in creation order) and answers questions about
// the tree, so that the same rules hold in the page, the API, the export
// and the request to the engine.
package thread

import "slices"

// Node is what the tree needs of a message.
type Node struct {
	ID       string
	ParentID string // "" for a root
}

// Tree is a conversation's messages indexed by parent.
type Tree struct {
	byID     map[string]int      // index in nodes
	children map[string][]string // by parent id ("" for the roots), oldest first
	nodes    []Node
}

// New indexes nodes, which must be in creation order (ids ascending). A
// node whose parent is missing counts as a root: a tree read while a
// branch is being deleted stays walkable.
func New(nodes []Node) *Tree {
	t := &Tree{byID: make(map[string]int, len(nodes)), children: map[string][]string{}, nodes: nodes}
	for i, n := range nodes {
		t.byID[n.ID] = i
	}
	for _, n := range nodes {
		p := n.ParentID
		if _, ok := t.byID[p]; !ok {
			p = ""
		}
		t.children[p] = append(t.children[p], n.ID)
	}
	return t
}

// Has tells whether id is in the tree.
func (t *Tree) Has(id string) bool {
	_, ok := t.byID[id]
	return ok
}

// Len is how many messages the tree holds.
func (t *Tree) Len() int { return len(t.nodes) }

// Parent returns id's parent ("" for a root or an unknown id).
func (t *Tree) Parent(id string) string {
	i, ok := t.byID[id]
	if !ok {
		return ""
	}
	if p := t.nodes[i].ParentID; t.Has(p) {
		return p
	}
	return ""
}

// Siblings returns the versions id is one of (itself included), oldest
// first: the children of its parent.
func (t *Tree) Siblings(id string) []string {
	if !t.Has(id) {
		return nil
	}
	return t.children[t.Parent(id)]
}

// Children returns id's children, oldest first ("" for the roots).
func (t *Tree) Children(id string) []string { return t.children[id] }

// Leaf returns the leaf of the path shown: leaf when it is in the tree,
// else (an old conversation, or none stored yet) the newest message's
// path's end — the newest message itself. "" for an empty tree.
func (t *Tree) Leaf(leaf string) string {
	if t.Has(leaf) {
		return leaf
	}
	if len(t.nodes) == 0 {
		return ""
	}
	return t.nodes[len(t.nodes)-1].ID
}

// Path returns the ids from a root down to leaf (the path shown when leaf
// is its end). An unknown leaf gives nil.
func (t *Tree) Path(leaf string) []string {
	if !t.Has(leaf) {
		return nil
	}
	var path []string
	seen := map[string]bool{}
	for id := leaf; id != "" && !seen[id]; id = t.Parent(id) {
		seen[id] = true // a cycle cannot be stored, but a loop must not hang a page
		path = append(path, id)
	}
	slices.Reverse(path)
	return path
}

// Newest returns the leaf reached from id by always taking the newest
// child: what showing a version of a message shows after it.
func (t *Tree) Newest(id string) string {
	if !t.Has(id) {
		return ""
	}
	for steps := 0; steps <= len(t.nodes); steps++ {
		kids := t.children[id]
		if len(kids) == 0 {
			break
		}
		id = kids[len(kids)-1]
	}
	return id
}

// Subtree returns id and every message below it.
func (t *Tree) Subtree(id string) []string {
	if !t.Has(id) {
		return nil
	}
	out := []string{id}
	for i := 0; i < len(out) && i <= len(t.nodes); i++ {
		out = append(out, t.children[out[i]]...)
	}
	return out
}

// Version is where a message stands among its siblings.
type Version struct {
	Index, Count int    // 1-based position, and how many there are
	Prev, Next   string // the sibling before and after ("" at either end)
}

// VersionOf returns id's place among its versions.
func (t *Tree) VersionOf(id string) Version {
	sib := t.Siblings(id)
	i := slices.Index(sib, id)
	if i < 0 {
		return Version{}
	}
	v := Version{Index: i + 1, Count: len(sib)}
	if i > 0 {
		v.Prev = sib[i-1]
	}
	if i+1 < len(sib) {
		v.Next = sib[i+1]
	}
	return v
}

// AfterRemoving returns the leaf to show once the subtree of removed is
// gone, when the path shown went through it: the newest remaining
// version's newest leaf, else the parent ("" when nothing remains above).
func (t *Tree) AfterRemoving(removed string) string {
	parent := t.Parent(removed)
	sib := t.Siblings(removed)
	for i := len(sib) - 1; i >= 0; i-- {
		if sib[i] != removed {
			return t.Newest(sib[i])
		}
	}
	return parent
}
