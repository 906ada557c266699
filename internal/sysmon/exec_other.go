//go:build !linux

package sysmon

// KeepAwake does nothing where the program cannot be run again in place.
func KeepAwake() error { return nil }
