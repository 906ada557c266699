//go:build !linux

package main

import "time"

// sleepFor uses Go's timer: the load generator still runs off Linux, only
// less evenly paced (the benchmarks are measured on Linux).
func sleepFor(d time.Duration) { time.Sleep(d) }
