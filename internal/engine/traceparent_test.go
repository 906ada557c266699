package engine

import "testing"

// Only a well-formed W3C traceparent from the link reaches the upstream.
func TestTraceparentFromTheLink(t *testing.T) {
	const good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, c := range []struct{ in, want string }{
		{good, good},
		{"", ""},
		{"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", ""}, // upper case
		{"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", ""}, // another version
		{"00-00000000000000000000000000000000-00f067aa0ba902b7-01", ""}, // zero trace id
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", ""}, // zero span id
		{good + "\r\nX-Evil: 1", ""},
		{good[:54], ""},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01", ""},
		{"00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01", ""},
	} {
		if got := traceparent(c.in); got != c.want {
			t.Errorf("traceparent(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
