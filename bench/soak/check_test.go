package main

import (
	"strings"
	"testing"
)

// The ledger check names each broken invariant: a row missing for an id a
// client saw, a row left pending, an outcome other than what the client
// saw, and more unexplained rows than requests that got no id.
func TestCheckLedger(t *testing.T) {
	recs := []record{
		{Kind: "stream", ID: "a", Status: 200, Saw: sawComplete},
		{Kind: "stop", ID: "b", Status: 200, Saw: sawStopped},
		{Kind: "whole", ID: "c", Status: 503, Saw: sawError, Detail: `{"error":{"code":"internal_error"}}`},
		{Kind: "abort", ID: "d", Saw: sawAborted},
		{Kind: "chat", Saw: sawFailed, Detail: "sign-in: refused"}, // sent nothing: explains no row
	}
	good := []row{
		{InferenceID: "a", Outcome: "success"},
		{InferenceID: "b", Outcome: "stopped", Reason: "stop_requested"},
		{InferenceID: "c", Outcome: "rejected", Status: 503},
		{InferenceID: "d", Outcome: "cancelled"},
	}
	if lc, vs := checkLedger(recs, good); len(vs) != 0 || lc.Seen != 4 {
		t.Fatalf("a clean ledger: %+v %+v", lc, vs)
	}
	cases := map[string][]row{
		"a row for every id a client saw":         good[1:],
		"no row pending after quiescence":         append([]row{{InferenceID: "a", Outcome: "pending"}}, good[1:]...),
		"each row's outcome as its client saw it": append([]row{{InferenceID: "a", Outcome: "error"}}, good[1:]...),
		"no row that no request explains":         append([]row{{InferenceID: "z", Outcome: "success"}}, good...),
	}
	for want, rows := range cases {
		_, vs := checkLedger(recs, rows)
		if len(vs) == 0 || !strings.Contains(vs[0].Invariant, want) {
			t.Errorf("%s: got %+v", want, vs)
		}
	}
}

// Growth beyond 10 % (rounded up to a whole goroutine) is a violation.
func TestCheckGrowth(t *testing.T) {
	before := []sample{{Replica: 0, RSSMiB: 50, Goroutines: 40}}
	if _, vs := checkGrowth(before, []sample{{Replica: 0, RSSMiB: 54, Goroutines: 44}}, maxGrowth); len(vs) != 0 {
		t.Fatalf("within bounds: %+v", vs)
	}
	if _, vs := checkGrowth(before, []sample{{Replica: 0, RSSMiB: 56, Goroutines: 45}}, maxGrowth); len(vs) != 2 {
		t.Fatalf("beyond both bounds: %+v", vs)
	}
}
