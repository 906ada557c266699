package journal

import (
	"encoding/json"
	"strconv"
	"time"

	"moonji/internal/jsonguard"
	"moonji/models"
)

// appendRow appends row as a JSON object with json.Marshal's keys and
// values, which json.Unmarshal reads back as the same row (readOld does).
// It is written by hand because it is on every request's path before its
// answer starts: json.Marshal's reflection took ~35 µs of a stream's first
// byte on a process waking from idle.
// TestRecordReadsBackAsMarshal keeps the two in step, field by field.
func appendRow(b []byte, u *models.Usage) ([]byte, error) {
	if !marshalable(u.CreatedAt) || (u.FinishedAt != nil && !marshalable(*u.FinishedAt)) {
		// json.Marshal refuses such a time; so does the journal.
		data, err := json.Marshal(u)
		return append(b, data...), err
	}
	b = append(b, `{"InferenceID":`...)
	b = jsonguard.AppendString(b, u.InferenceID)
	b = append(b, `,"CreatedAt":`...)
	b = appendTime(b, &u.CreatedAt)
	b = append(b, `,"FinishedAt":`...)
	b = appendTime(b, u.FinishedAt)
	b = append(b, `,"UserID":`...)
	b = appendUint(b, u.UserID)
	b = append(b, `,"User":`...)
	b = jsonguard.AppendString(b, u.User)
	b = append(b, `,"KeyID":`...)
	b = appendUint(b, u.KeyID)
	for _, f := range [...]struct{ key, value string }{
		{`,"Source":`, u.Source}, {`,"API":`, u.API}, {`,"Model":`, u.Model}, {`,"Backend":`, u.Backend},
		{`,"RetriedFrom":`, u.RetriedFrom}, {`,"ResponseID":`, u.ResponseID}, {`,"Outcome":`, u.Outcome},
	} {
		b = append(b, f.key...)
		b = jsonguard.AppendString(b, f.value)
	}
	b = append(b, `,"Status":`...)
	b = strconv.AppendInt(b, int64(u.Status), 10)
	b = append(b, `,"Reason":`...)
	b = jsonguard.AppendString(b, u.Reason)
	b = append(b, `,"PromptTokens":`...)
	b = strconv.AppendInt(b, int64(u.PromptTokens), 10)
	b = append(b, `,"CompletionTokens":`...)
	b = strconv.AppendInt(b, int64(u.CompletionTokens), 10)
	b = append(b, `,"CachedTokens":`...)
	b = strconv.AppendInt(b, int64(u.CachedTokens), 10)
	b = append(b, `,"Cost":`...)
	b = strconv.AppendInt(b, u.Cost, 10)
	b = append(b, `,"UsageSource":`...)
	b = jsonguard.AppendString(b, u.UsageSource)
	b = append(b, `,"QueueMs":`...)
	b = strconv.AppendInt(b, u.QueueMs, 10)
	b = append(b, `,"TTFTMs":`...)
	if u.TTFTMs == nil {
		b = append(b, "null"...)
	} else {
		b = strconv.AppendInt(b, *u.TTFTMs, 10)
	}
	b = append(b, `,"DurationMs":`...)
	b = strconv.AppendInt(b, u.DurationMs, 10)
	b = append(b, `,"Replica":`...)
	b = jsonguard.AppendString(b, u.Replica)
	return append(b, '}'), nil
}

// marshalable tells whether json.Marshal accepts t (a four-digit year).
func marshalable(t time.Time) bool {
	y := t.Year()
	return y >= 0 && y <= 9999
}

// appendTime appends t as json.Marshal does (RFC 3339 with nanoseconds), or
// null.
func appendTime(b []byte, t *time.Time) []byte {
	if t == nil {
		return append(b, "null"...)
	}
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"')
}

func appendUint(b []byte, v *uint) []byte {
	if v == nil {
		return append(b, "null"...)
	}
	return strconv.AppendUint(b, uint64(*v), 10)
}
