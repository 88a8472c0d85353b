package main

import (
	"context"
	"fmt"

	"github.com/cuesched/cuesched/shared/cli"

	"github.com/cuesched/cuesched/rollout"
)

// openTool opens the connections, checks that the database is a Cuebot
// database (with the rollout when needRollout) and opens the rollout tool
// on them.
func openTool(ctx context.Context, c *cli.Env, name string, v cli.ConnValues, needRollout bool) (tool *rollout.Tool, cleanup func(), code int) {
	cn, code := cli.OpenConns(ctx, c, name, v, 4)
	if code != 0 {
		return nil, nil, code
	}
	if code := checkCuebot(ctx, c, name, cn, needRollout); code != 0 {
		cn.Close()
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

// checkCuebot makes the shared rollout.CheckCuebotDatabase check and
// prints its one line; code is 1 when the database is not a Cuebot
// database (or lacks the rollout when needRollout) or cannot be asked.
func checkCuebot(ctx context.Context, c *cli.Env, name string, cn *cli.Conns, needRollout bool) int {
	if err := rollout.CheckCuebotDatabase(ctx, cn.Pool, cn.Pool.Config().ConnConfig, needRollout); err != nil {
		fmt.Fprintf(c.Stderr, "%s: %v\n", name, err)
		return 1
	}
	return 0
}
