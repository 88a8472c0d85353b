package faults

import (
	"google.golang.org/grpc/codes"

	"github.com/cuesched/cuesched/shared/testkit/fakerqd"
)

func fakerqdGarbage() fakerqd.Behavior { return fakerqd.Behavior{Mode: fakerqd.Garbage} }

func fakerqdRefuse() fakerqd.Behavior {
	return fakerqd.Behavior{Mode: fakerqd.RefuseLaunch, RefuseCode: codes.ResourceExhausted}
}
