package usageexport

import (
	"bufio"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
)

// Format is how one kind of record is exported: its CSV header and cells,
// and the value JSONL encodes for it.
type Format[T any] struct {
	Header []string
	CSV    func(T) []string
	JSON   func(T) any
}

// batch is how many records go to the writer between flushes: small enough
// that a client sees the file arrive, large enough that flushing costs
// nothing per record.
const batch = 500

// Stream writes the records each hands it to w in format (CSV with a header
// line, or JSONL), without holding them in memory. flushed, when not nil,
// is called after each batch has been handed to w and at the end, so that
// a caller serving a slow client can renew its write deadline.
func Stream[T any](w io.Writer, format string, f Format[T], each func(emit func(T) error) error, flushed func() error) error {
	bw := bufio.NewWriterSize(w, 32<<10)
	var encode func(T) error
	flush := bw.Flush
	switch format {
	case JSONL:
		enc := json.NewEncoder(bw)
		encode = func(r T) error { return enc.Encode(f.JSON(r)) }
	case CSV:
		cw := csv.NewWriter(bw)
		if err := cw.Write(f.Header); err != nil {
			return err
		}
		encode = func(r T) error { return cw.Write(f.CSV(r)) }
		flush = func() error {
			cw.Flush()
			if err := cw.Error(); err != nil {
				return err
			}
			return bw.Flush()
		}
	default:
		return fmt.Errorf("unknown export format %q", format)
	}
	flushBatch := func() error {
		if err := flush(); err != nil {
			return err
		}
		if flushed != nil {
			return flushed()
		}
		return nil
	}
	n := 0
	err := each(func(r T) error {
		if err := encode(r); err != nil {
			return err
		}
		if n++; n%batch == 0 {
			return flushBatch()
		}
		return nil
	})
	if err != nil {
		return err
	}
	return flushBatch()
}
