package ledger

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"moonji/internal/testdb"
	"moonji/models"
)

// BenchmarkRecord measures the CPU one final row costs the ledger (the row
// of a refused request, or of a request begun and finished within one
// batch), written in the batches the writer forms: on SQLite, and on
// PostgreSQL when MOONJI_TEST_POSTGRES_DSN is set. cpu-µs/row is this
// process's CPU (user and system) per row; machine-cpu-µs/row counts every
// process on the machine (for PostgreSQL, its backend too), so run it on
// an otherwise quiet machine.
//
//	go test ./internal/ledger -run '^$' -bench Record -benchmem
func BenchmarkRecord(b *testing.B) {
	for name, mk := range testdb.URLs() {
		b.Run(name, func(b *testing.B) {
			db, err := models.Open(mk(b))
			if err != nil {
				b.Fatal(err)
			}
			l := New(db, nil)
			defer func() { l.Close(); models.Close(db) }()
			now := time.Now().UTC()
			b.ReportAllocs()
			cpu0, machine0 := processCPU(), machineCPU()
			i := 0
			for b.Loop() {
				r := models.Usage{InferenceID: fmt.Sprintf("inf_%026d", i), CreatedAt: now, Model: "m", Source: "api",
					Outcome: models.OutcomeRejected, Status: 503, Reason: "queue_full", User: "a@example.com", Replica: "r"}
				l.Record(r)
				i++
				if i%64 == 0 {
					_ = l.Flush(context.Background())
				}
			}
			_ = l.Flush(context.Background())
			b.ReportMetric(float64(processCPU()-cpu0)/float64(time.Microsecond)/float64(i), "cpu-µs/row")
			b.ReportMetric(float64(machineCPU()-machine0)/float64(time.Microsecond)/float64(i), "machine-cpu-µs/row")
		})
	}
}

// processCPU is the CPU time (user and system) this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// machineCPU is the CPU time every core of the machine has spent busy
// (the first line of /proc/stat: user, nice, system, irq and softirq), or
// 0 where there is no /proc/stat.
func machineCPU() time.Duration {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(data), "\n")
	fields := strings.Fields(line)
	var busy int64
	for _, i := range []int{1, 2, 3, 6, 7} {
		if i < len(fields) {
			n, _ := strconv.ParseInt(fields[i], 10, 64)
			busy += n
		}
	}
	return time.Duration(busy) * time.Second / 100 // USER_HZ
}
