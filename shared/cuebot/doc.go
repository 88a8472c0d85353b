// Package cuebot holds the conventions of the Cuebot PostgreSQL schema that
// every cuesched component must agree on: units, ids, and the text values
// Cuebot stores for states and types.
//
// Units. PostgreSQL keeps CPU in centicores (100 = one core) in every
// int_*cores* column and in proc.int_cores_reserved; memory and GPU memory
// in KB (KiB, 1 GB = 1,048,576 KB); GPUs as whole devices. Redis (the
// accounting store) keeps whole cores. Conversions happen only at those
// edges, through the functions here:
//
//   - CenticoresToCores truncates toward zero, exactly like Java and Rust
//     integer division in Cuebot's AccountingNotifier and the reference
//     scheduler: 250 -> 2, 50 -> 0 (a sub-core amount is invisible in whole
//     cores), -250 -> -2. The Unlimited sentinel (-1) is kept as -1.
//   - CoresToCenticores multiplies by 100 and keeps Unlimited.
//   - CoresFloatToCenticores rounds a fractional core count (from a config
//     file or a CLI flag) to the nearest centicore.
//
// Ids. Every key is varchar(36) text. Cuebot writes lowercase, hyphenated
// random (version 4) UUIDs from Java's UUID.randomUUID().toString(); its
// seed data uses fixed uppercase ids such as
// "AAAAAAAA-AAAA-AAAA-AAAA-AAAAAAAAAAA0". Comparisons in the database are
// plain, case-sensitive text equality, so ids must be passed around
// verbatim: never re-case or re-format an id read from the database.
// NewID makes ids the way Cuebot does; CheckID validates an id read from
// input.
//
// States. Cuebot stores protobuf enum names (UPPERCASE) as text. The typed
// constants here carry the exact strings; Parse* functions reject anything
// else with an error naming the value.
package cuebot
