// Command moonji is a self-hosted gateway in front of LLM inference engines.
//
//	moonji serve [--config FILE]
//	moonji mockllm [--listen ADDR]
//	moonji keys create --owner EMAIL --name NAME [--expires DURATION] [--rpm N]
//	moonji keys list
//	moonji keys revoke ID
//	moonji usage export [--since TIME] [--format jsonl|csv]
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"moonji/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := cli.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case err == nil:
	case errors.Is(err, cli.ErrUsage):
		fmt.Fprintf(os.Stderr, "moonji: %v\n\n%s", err, cli.Usage)
		os.Exit(2)
	default:
		fmt.Fprintf(os.Stderr, "moonji: %v\n", err)
		os.Exit(1)
	}
}
