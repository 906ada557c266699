package budget

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// NewRedis returns a Store whose state lives in Redis under prefix (e.g.
// "moonji:"), shared by every replica given the same Redis and prefix.
// rdb stays the caller's to close; its timeouts, or the contexts given to
// the calls, bound how long a hung Redis can hold a request. log may be
// nil (slog.Default()). NewRedis panics on a nil Spender, a programming
// error.
func NewRedis(rdb redis.UniversalClient, prefix string, spend Spender, log *slog.Logger) *Store {
	return newStore(&redisEngine{rdb: rdb, prefix: prefix}, spend, log)
}

type redisEngine struct {
	rdb    redis.UniversalClient
	prefix string
}

// keysOf returns the four keys of each window, in the scripts' order.
func (e *redisEngine) keysOf(ws []window) []string {
	keys := make([]string, 0, 4*len(ws))
	for _, w := range ws {
		base := e.prefix + w.name + ":"
		keys = append(keys, base+"spent", base+"res", base+"dl", base+"rsum")
	}
	return keys
}

func unavailable(op string, err error) error {
	return fmt.Errorf("budget: %s: %w: %w", op, ErrUnavailable, err)
}

func (e *redisEngine) reserve(ctx context.Context, id string, ws []window, amount int64, ttl time.Duration, now time.Time) (reserveResult, error) {
	args := make([]any, 0, 4+2*len(ws))
	args = append(args, id, amount, now.UnixMilli(), now.Add(ttl).UnixMilli())
	for _, w := range ws {
		// Reservation keys outlive their reservations.
		keep := max(w.keep(now), 2*ttl)
		args = append(args, w.limit.Amount, keep.Milliseconds())
	}
	out, err := reserveScript.Run(ctx, e.rdb, e.keysOf(ws), args...).Slice()
	if err != nil {
		return reserveResult{}, unavailable("reserve "+id, err)
	}
	r := reserveResult{refused: -1}
	switch code, _ := out[0].(int64); code {
	case 0:
	case 1:
		r.missing, err = indexes(out[1:], len(ws))
	case 2:
		if len(out) != 4 {
			err = fmt.Errorf("refusal of %d values", len(out))
			break
		}
		var i []int
		if i, err = indexes(out[1:2], len(ws)); err != nil {
			break
		}
		r.refused = i[0]
		if r.spent, err = integer(out[2]); err == nil {
			r.reserved, err = integer(out[3])
		}
	default:
		err = fmt.Errorf("unknown answer %v", out)
	}
	if err != nil {
		return reserveResult{}, unavailable("reserve "+id+": read the script's answer", err)
	}
	return r, nil
}

func (e *redisEngine) setSpent(ctx context.Context, ws []window, spent []int64, now time.Time) error {
	keys := e.keysOf(ws)
	_, err := e.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, w := range ws {
			// NX: another replica may have built it meanwhile, and settled
			// onto it since; its value is as good as ours and newer.
			p.SetNX(ctx, keys[4*i], spent[i], w.keep(now))
		}
		return nil
	})
	if err != nil {
		return unavailable("store spent", err)
	}
	return nil
}

func (e *redisEngine) settle(ctx context.Context, id string, ws []window, cost int64) error {
	if err := settleScript.Run(ctx, e.rdb, e.keysOf(ws), id, cost).Err(); err != nil {
		return unavailable("settle "+id, err)
	}
	return nil
}

func (e *redisEngine) status(ctx context.Context, ws []window, now time.Time) ([]int, []State, error) {
	out, err := statusScript.Run(ctx, e.rdb, e.keysOf(ws), now.UnixMilli()).Slice()
	if err != nil {
		return nil, nil, unavailable("status", err)
	}
	var missing []int
	var states []State
	switch code, _ := out[0].(int64); code {
	case 1:
		missing, err = indexes(out[1:], len(ws))
	case 0:
		if len(out) != 1+2*len(ws) {
			err = fmt.Errorf("%d values for %d windows", len(out), len(ws))
			break
		}
		states = make([]State, len(ws))
		for i, w := range ws {
			states[i] = State{Limit: w.limit, Renews: w.renews}
			if states[i].Spent, err = integer(out[1+2*i]); err != nil {
				break
			}
			if states[i].Reserved, err = integer(out[2+2*i]); err != nil {
				break
			}
		}
	default:
		err = fmt.Errorf("unknown answer %v", out)
	}
	if err != nil {
		return nil, nil, unavailable("status: read the script's answer", err)
	}
	return missing, states, nil
}

// indexes turns the scripts' 1-based window numbers into indexes.
func indexes(vs []any, n int) ([]int, error) {
	if len(vs) == 0 {
		return nil, fmt.Errorf("no window numbers")
	}
	out := make([]int, len(vs))
	for j, v := range vs {
		i, ok := v.(int64)
		if !ok || i < 1 || int(i) > n {
			return nil, fmt.Errorf("window number %v of %d", v, n)
		}
		out[j] = int(i) - 1
	}
	return out, nil
}

// integer reads an amount the scripts return as Redis's decimal string.
func integer(v any) (int64, error) {
	switch v := v.(type) {
	case string:
		return strconv.ParseInt(v, 10, 64)
	case int64:
		return v, nil
	}
	return 0, fmt.Errorf("amount %v (%T)", v, v)
}
