package thread

import (
	"slices"
	"testing"
)

// sample is a conversation edited and regenerated:
//
//	u1 ─ a1
//	   ╰ a1b ─ u2 ─ a2
//	u1e ─ a1e            (u1 edited)
func sample() *Tree {
	return New([]Node{
		{ID: "m01"},                  // u1
		{ID: "m02", ParentID: "m01"}, // a1
		{ID: "m03", ParentID: "m01"}, // a1b: a1 regenerated
		{ID: "m04", ParentID: "m03"}, // u2
		{ID: "m05", ParentID: "m04"}, // a2
		{ID: "m06"},                  // u1e: u1 edited
		{ID: "m07", ParentID: "m06"}, // a1e
	})
}

func TestPathFollowsParents(t *testing.T) {
	tr := sample()
	if got := tr.Path("m05"); !slices.Equal(got, []string{"m01", "m03", "m04", "m05"}) {
		t.Fatalf("path to m05 = %v", got)
	}
	if got := tr.Path("m07"); !slices.Equal(got, []string{"m06", "m07"}) {
		t.Fatalf("path to m07 = %v", got)
	}
	if got := tr.Path("nope"); got != nil {
		t.Fatalf("path to an unknown leaf = %v", got)
	}
}

func TestLeafDefaultsToNewest(t *testing.T) {
	tr := sample()
	if got := tr.Leaf(""); got != "m07" {
		t.Fatalf("leaf of no choice = %s, want the newest message", got)
	}
	if got := tr.Leaf("m02"); got != "m02" {
		t.Fatalf("leaf m02 = %s", got)
	}
	if got := New(nil).Leaf(""); got != "" {
		t.Fatalf("leaf of an empty tree = %q", got)
	}
}

func TestVersions(t *testing.T) {
	tr := sample()
	cases := map[string]Version{
		"m01": {Index: 1, Count: 2, Next: "m06"},
		"m06": {Index: 2, Count: 2, Prev: "m01"},
		"m02": {Index: 1, Count: 2, Next: "m03"},
		"m03": {Index: 2, Count: 2, Prev: "m02"},
		"m05": {Index: 1, Count: 1},
	}
	for id, want := range cases {
		if got := tr.VersionOf(id); got != want {
			t.Errorf("version of %s = %+v, want %+v", id, got, want)
		}
	}
}

func TestNewestFollowsNewestChildren(t *testing.T) {
	tr := sample()
	if got := tr.Newest("m01"); got != "m05" {
		t.Fatalf("newest under m01 = %s, want m05 (through the regenerated answer)", got)
	}
	if got := tr.Newest("m02"); got != "m02" {
		t.Fatalf("newest under a leaf = %s", got)
	}
}

func TestSubtreeAndRemoval(t *testing.T) {
	tr := sample()
	got := tr.Subtree("m03")
	slices.Sort(got)
	if !slices.Equal(got, []string{"m03", "m04", "m05"}) {
		t.Fatalf("subtree of m03 = %v", got)
	}
	if got := tr.AfterRemoving("m03"); got != "m02" {
		t.Fatalf("after removing m03 = %s, want its sibling m02", got)
	}
	if got := tr.AfterRemoving("m04"); got != "m03" {
		t.Fatalf("after removing the only child m04 = %s, want its parent", got)
	}
	if got := tr.AfterRemoving("m06"); got != "m05" {
		t.Fatalf("after removing root m06 = %s, want the other root's newest leaf", got)
	}
	lone := New([]Node{{ID: "a"}, {ID: "b", ParentID: "a"}})
	if got := lone.AfterRemoving("a"); got != "" {
		t.Fatalf("after removing the only root = %q, want nothing", got)
	}
}

func TestOrphansAndLoopsStayWalkable(t *testing.T) {
	// A parent that is gone makes a root; a loop (never stored, but
	// data is data) must not hang.
	tr := New([]Node{{ID: "a", ParentID: "gone"}, {ID: "b", ParentID: "c"}, {ID: "c", ParentID: "b"}})
	if got := tr.Path("a"); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("path of an orphan = %v", got)
	}
	if got := tr.Path("b"); len(got) > 2 {
		t.Fatalf("path through a loop = %v", got)
	}
	_ = tr.Newest("b")
	if got := tr.Subtree("b"); len(got) > 3*tr.Len() {
		t.Fatalf("subtree through a loop grew to %d", len(got))
	}
}
