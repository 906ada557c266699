package connwatch

import (
	"io"
	"net"
	"testing"
	"time"
)

// pair returns the server side of a fresh loopback TCP connection and the
// client side.
func pair(t *testing.T) (server, client net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Close(); client.Close() })
	return server, client
}

func TestNoticesPeerClose(t *testing.T) {
	server, client := pair(t)
	closed := make(chan time.Time, 1)
	stop := Watch(server, func() { closed <- time.Now() })
	defer stop()
	time.Sleep(20 * time.Millisecond)
	left := time.Now()
	client.Close()
	select {
	case at := <-closed:
		if lag := at.Sub(left); lag > 100*time.Millisecond {
			t.Errorf("noticed after %v", lag)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the peer's close went unnoticed")
	}
}

func TestStopLeavesTheConnectionUsable(t *testing.T) {
	server, client := pair(t)
	fired := make(chan struct{}, 1)
	stop := Watch(server, func() { fired <- struct{}{} })
	time.Sleep(20 * time.Millisecond)
	stop()
	stop() // twice is harmless
	// The next request's bytes are read normally: nothing was consumed and
	// no deadline is left behind.
	if _, err := client.Write([]byte("GET / HTTP/1.1\r\n")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	server.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := io.ReadFull(server, buf); err != nil || string(buf) != "GET / HTTP/1.1\r\n" {
		t.Fatalf("read after stop: %q %v", buf, err)
	}
	select {
	case <-fired:
		t.Error("onClose fired for a live connection")
	default:
	}
}

func TestPipelinedBytesAreNotAClose(t *testing.T) {
	server, client := pair(t)
	fired := make(chan struct{}, 1)
	stop := Watch(server, func() { fired <- struct{}{} })
	client.Write([]byte("x"))
	time.Sleep(50 * time.Millisecond)
	stop()
	select {
	case <-fired:
		t.Error("data from the peer was taken for a close")
	default:
	}
	buf := make([]byte, 1)
	if _, err := server.Read(buf); err != nil || buf[0] != 'x' {
		t.Errorf("the peeked byte was consumed: %q %v", buf, err)
	}
}
