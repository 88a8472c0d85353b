package cuebot

import (
	"fmt"

	"github.com/google/uuid"
)

// IDLength is the width of every Cuebot key column (varchar(36)).
const IDLength = 36

// NewID returns a new key the way Cuebot makes them: a random (version 4)
// UUID in lowercase hyphenated form, e.g.
// "9f1c2d3e-4b5a-4c6d-8e7f-0a1b2c3d4e5f".
func NewID() string { return uuid.NewString() }

// CheckID validates an id taken from input (a flag, a config file, a NOTIFY
// payload) before it is used in a query: it must be non-empty, at most 36
// characters and contain no whitespace or control characters. Ids are not
// required to be UUIDs (Cuebot's seed ids are uppercase UUID-shaped text,
// and nothing stops an operator from inserting other text) and are never
// normalised: case matters in the database.
func CheckID(kind, id string) error {
	if id == "" {
		return fmt.Errorf("cuebot: empty %s id", kind)
	}
	if len(id) > IDLength {
		return fmt.Errorf("cuebot: %s id %q is %d characters, longer than the %d of a Cuebot key", kind, id, len(id), IDLength)
	}
	for _, r := range id {
		if r <= ' ' || r == 0x7f {
			return fmt.Errorf("cuebot: %s id %q contains whitespace or a control character", kind, id)
		}
	}
	return nil
}

// IsCanonicalUUID reports whether id is a UUID in the lowercase hyphenated
// form Cuebot's Java code writes (seed ids, which are uppercase, are not).
func IsCanonicalUUID(id string) bool {
	u, err := uuid.Parse(id)
	return err == nil && len(id) == IDLength && u.String() == id
}

// Ids of the rows a stock Cuebot database is seeded with (and the baseline
// schema in migrations/ recreates).
const (
	SeedShowTesting        = "00000000-0000-0000-0000-000000000000" // show "testing"
	SeedFolderTesting      = "A0000000-0000-0000-0000-000000000000" // root folder of "testing"
	SeedPointTesting       = "FFEEDDCC-AAAA-AAAA-AAAA-AAAAAAAAAAA0" // point (testing, Pipeline)
	SeedFacilityCloud      = "AAAAAAAA-AAAA-AAAA-AAAA-AAAAAAAAAAA0" // default facility
	SeedFacilityLocal      = "AAAAAAAA-AAAA-AAAA-AAAA-AAAAAAAAAAA1"
	SeedDeptPipeline       = "AAAAAAAA-AAAA-AAAA-AAAA-AAAAAAAAAAA6"
	SeedDeptUnknown        = "AAAAAAAA-AAAA-AAAA-AAAA-AAAAAAAAAAA7" // default dept
	SeedAllocLocalGeneral  = "00000000-0000-0000-0000-000000000000" // tag "general", facility local
	SeedAllocLocalDesktop  = "00000000-0000-0000-0000-000000000001" // tag "desktop"
	SeedAllocLocalUnassign = "00000000-0000-0000-0000-000000000002" // tag "unassigned"
	SeedAllocCloudGeneral  = "00000000-0000-0000-0000-000000000003" // tag "general", facility cloud
	SeedAllocCloudUnassign = "00000000-0000-0000-0000-000000000004"
	// Subscriptions of "testing" (size = burst = 100000 centicores).
	SeedSubLocalGeneral = "00000000-0000-0000-0000-000000000001"
	SeedSubLocalDesktop = "00000000-0000-0000-0000-000000000002"
	SeedSubCloudGeneral = "00000000-0000-0000-0000-000000000003"
)
