package journal

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"moonji/models"
)

// readBack decodes a record as readOld does.
func readBack(t *testing.T, data []byte) models.Usage {
	t.Helper()
	var u models.Usage
	if err := json.Unmarshal(data, &u); err != nil {
		t.Fatalf("record %s does not decode: %v", data, err)
	}
	return u
}

// A record reads back as the same row json.Marshal's would, whatever its
// strings, pointers and times hold.
func TestRecordReadsBackAsMarshal(t *testing.T) {
	uid, kid := uint(7), uint(1<<40)
	ttft := int64(-3)
	fin := time.Date(2026, 12, 2, 13, 0, 0, 123456789, time.FixedZone("KST", 9*3600))
	rows := []models.Usage{
		{},
		{InferenceID: "inf_1", CreatedAt: time.Now(), Outcome: models.OutcomePending, Replica: "r1"},
		{InferenceID: "inf_\"2\"\\", CreatedAt: time.Now().UTC(), FinishedAt: &fin, UserID: &uid, User: "bob <b@x> & \u2028",
			KeyID: &kid, Source: "api", API: "chat", Model: "llama\x00-3\t\"8b\"\\\x7f", Backend: "b1,b2", RetriedFrom: "b0",
			ResponseID: "resp_1", Outcome: models.OutcomeSuccess, Status: 200, Reason: "bad \xff\xfe utf-8 \U0001F600",
			PromptTokens: -1, CompletionTokens: 1 << 31, UsageSource: "engine", QueueMs: -5, TTFTMs: &ttft,
			DurationMs: 1 << 50, Replica: "host/127.0.0.1:8080"},
	}
	for _, u := range rows {
		rec, err := appendRow(nil, &u)
		if err != nil {
			t.Fatal(err)
		}
		want, err := json.Marshal(&u)
		if err != nil {
			t.Fatal(err)
		}
		if got, wantRow := readBack(t, rec), readBack(t, want); !reflect.DeepEqual(got, wantRow) {
			t.Errorf("record reads back as\n%+v\nwant (json.Marshal's)\n%+v", got, wantRow)
		}
	}
}

// Every field of the row is in the record: a field added to models.Usage
// and not to appendRow fails here.
func TestRecordHasEveryField(t *testing.T) {
	rec, err := appendRow(nil, &models.Usage{})
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(rec, &got); err != nil {
		t.Fatal(err)
	}
	typ := reflect.TypeOf(models.Usage{})
	for i := range typ.NumField() {
		if _, ok := got[typ.Field(i).Name]; !ok {
			t.Errorf("field %s is not in the journal's record", typ.Field(i).Name)
		}
	}
	if len(got) != typ.NumField() {
		t.Errorf("record has %d keys, the row %d fields", len(got), typ.NumField())
	}
}

// A time json.Marshal refuses is refused, not written unreadable.
func TestRecordRefusesWhatMarshalRefuses(t *testing.T) {
	u := models.Usage{InferenceID: "x", CreatedAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}
	if _, err := appendRow(nil, &u); err == nil {
		t.Error("a year-10000 time was encoded")
	}
}

func FuzzRecord(f *testing.F) {
	f.Add("inf_1", "a@b", "m", "reason", int64(5), true)
	f.Add("\x00\"\\", "\xff", "\u2028<>&", "\U0001F600", int64(-1), false)
	f.Fuzz(func(t *testing.T, id, user, model, reason string, n int64, ptrs bool) {
		u := models.Usage{InferenceID: id, CreatedAt: time.Unix(0, n).UTC(), User: user, Model: model, Reason: reason,
			QueueMs: n, Status: int(int32(n))}
		if ptrs {
			v, ms := uint(uint32(n)), n
			at := time.Unix(n%(1<<34), 0)
			u.UserID, u.TTFTMs, u.FinishedAt = &v, &ms, &at
		}
		want, werr := json.Marshal(&u)
		rec, err := appendRow(nil, &u)
		if (err != nil) != (werr != nil) {
			t.Fatalf("appendRow error %v, json.Marshal's %v", err, werr)
		}
		if err != nil {
			return
		}
		if got, wantRow := readBack(t, rec), readBack(t, want); !reflect.DeepEqual(got, wantRow) {
			t.Errorf("record %s reads back as %+v, want %+v", rec, got, wantRow)
		}
	})
}
