// Package cli implements moonji's command line: serve, engine, mockllm, keys,
// people, teams and usage. Its flags and outputs are a public interface: scripts depend on them.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
)

const usageText = `Moonji: a gateway in front of LLM inference engines.

Usage:
  moonji serve [--config FILE]                 run the server
  moonji mockllm [--listen ADDR]               run a stand-alone fake OpenAI-compatible engine
  moonji engine [--listen ADDR]                serve the config's models to gateways (ws://ADDR/engine;
                                               default 127.0.0.1:9300; another address needs engine.token
                                               or MOONJI_ENGINE_TOKEN)
  moonji keys create --owner EMAIL --name NAME [--expires DURATION] [--rpm N]
                    [--budget AMOUNT [--budget-period day|month|total]] [--models A,B]
                    [--scope inference|admin]
                                               issue an API key (printed once, alone on stdout);
                                               a budget's period is month unless given; an admin-
                                               scoped key (admin owners only) works on /api/v1/admin
  moonji keys list                             list keys
  moonji keys revoke ID                        revoke a key
  moonji usage export [--since TIME] [--format jsonl|csv]
                                               print the usage ledger
  moonji usage rollup                          rebuild the dashboards' sums from the ledger
  moonji people add --email EMAIL [--admin] [--dev-password-stdin]
                                               add a person (the password: embedded provider only)
  moonji people list [--filter TEXT]           list people
  moonji people disable|enable EMAIL           end a person's sessions and stop their keys, or undo it
  moonji people budget EMAIL AMOUNT day|month|total
                                               set what a person may spend over all their keys
                                               and the chat (AMOUNT none: no budget)
  moonji teams create NAME [--budget AMOUNT [--budget-period day|month|total]] [--models A,B]
                                               make a team
  moonji teams add|remove NAME EMAIL           put a person in a team, or take them out
  moonji teams list                            list teams

Every subcommand takes --config FILE (or MOONJI_CONFIG); with neither, the
embedded default is used (SQLite under ./data, the built-in demo model).
`

// ErrUsage marks a command-line mistake: the caller prints Usage and exits 2.
var ErrUsage = errors.New("usage")

// Usage is the help text.
const Usage = usageText

// Run runs one moonji command line (without the program name).
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: a subcommand is required", ErrUsage)
	}
	switch args[0] {
	case "serve":
		return cmdServe(ctx, args[1:], stderr)
	case "mockllm":
		return cmdMockLLM(ctx, args[1:], stdout)
	case "engine":
		return cmdEngine(ctx, args[1:], stderr)
	case "keys":
		return cmdKeys(ctx, args[1:], stdout)
	case "usage":
		return cmdUsage(ctx, args[1:], stdout)
	case "people":
		return cmdPeople(ctx, args[1:], stdout)
	case "teams":
		return cmdTeams(ctx, args[1:], stdout)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usageText)
		return nil
	default:
		return fmt.Errorf("%w: unknown subcommand %q", ErrUsage, args[0])
	}
}
