package connwatch

import "golang.org/x/sys/unix"

// tcpStateOf reads the socket's TCP state from TCP_INFO.
func tcpStateOf(fd int) tcpState {
	info, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
	if err != nil {
		return stateReset
	}
	switch info.State {
	case unix.BPF_TCP_ESTABLISHED:
		return stateOpen
	case unix.BPF_TCP_CLOSE_WAIT:
		return statePeerFinished
	case unix.BPF_TCP_CLOSE:
		return stateReset
	}
	return stateOther
}
