//go:build !unix

package proxy

import "net"

// answerReader is what an engine connection's buffered reader reads from
// (see sendread_unix.go); here a request is written at once.
type answerReader struct{ conn net.Conn }

func newAnswerReader(c net.Conn) *answerReader { return &answerReader{conn: c} }

func (r *answerReader) send(header, body []byte, sent func()) error {
	bufs := net.Buffers{header, body}
	if _, err := bufs.WriteTo(r.conn); err != nil {
		return err
	}
	if sent != nil {
		sent()
	}
	return nil
}

func (r *answerReader) Read(p []byte) (int, error) { return r.conn.Read(p) }
