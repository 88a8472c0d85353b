//go:build tools

// Package tools pins module dependencies that are used across the tree before
// every package that needs them exists.
package tools

import (
	_ "github.com/google/btree"
	_ "github.com/google/uuid"
	_ "github.com/hashicorp/go-hclog"
	_ "github.com/jackc/pglogrepl"
	_ "github.com/jackc/pgx/v5"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/redis/go-redis/v9"
	_ "go.yaml.in/yaml/v3"
	_ "google.golang.org/grpc"
	_ "google.golang.org/protobuf/proto"
)
