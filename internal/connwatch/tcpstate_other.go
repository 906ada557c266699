//go:build unix && !linux

package connwatch

import "syscall"

// tcpStateOf cannot read the TCP state here (only Linux's TCP_INFO is
// read), only whether an RST came: the socket then holds an error. After a
// FIN a peek returns 0 even once the RST is there, so this is what tells a
// probed client that left from one that half-closed and still reads.
func tcpStateOf(fd int) tcpState {
	if errno, err := syscall.GetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_ERROR); err != nil || errno != 0 {
		return stateReset
	}
	return stateUnknown
}
