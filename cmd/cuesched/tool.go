package main

import (
	"context"
	"fmt"

	"github.com/cuesched/cuesched/shared/cli"

	"github.com/cuesched/cuesched/rollout"
)

// openTool opens the connections and the rollout tool on them.
func openTool(ctx context.Context, c *cli.Env, name string, v cli.ConnValues) (tool *rollout.Tool, cleanup func(), code int) {
	cn, code := cli.OpenConns(ctx, c, name, v, 4)
	if code != 0 {
		return nil, nil, code
	}
	tool, err := rollout.New(cn.Pool, rollout.Options{Publisher: cn.Pub, Logger: c.Logger})
	if err != nil {
		cn.Close()
		fmt.Fprintf(c.Stderr, "%s: %v\n", name, err)
		return nil, nil, 1
	}
	return tool, cn.Close, 0
}
