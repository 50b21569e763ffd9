// Package intern numbers strings that many records name, so a record
// keeps a uint32 instead of a string header: core's lock table and
// lockservice's lease table name each lock's identity this way.
//
// # What it owns
//
// Table: reference-counted IDs for strings. ID 0 is the empty string and
// is never freed; an ID whose count falls to zero is reused. No map is
// ever iterated, so nothing here depends on map order.
package intern
