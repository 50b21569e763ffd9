// Package doctest runs the shell blocks of a Markdown page the way a user
// types them: one bash session per page, the blocks in order, each
// command line a step whose exit status, output and trailing comment are
// checked. cmd/ticketd's TestDocsRun uses it on README.md and every
// examples/*/README.md, so a block that stops working fails a test.
//
// # What it owns
//
// Parse (markdown.go): the fenced blocks of a page whose language is sh,
// bash or shell, with the doctest directives written as HTML comments on
// the lines right above the fence (invisible when the page is rendered):
//
//	<!-- doctest: skip (REASON) -->   not run (its ticketd lines are still parsed)
//	<!-- doctest: needs TOOL... -->   run only when every TOOL is on PATH; else
//	                                  this block and the rest of the page are not run
//	<!-- doctest: unprivileged -->    run only when not root (postgres refuses
//	                                  root); else, the same
//	<!-- doctest: before COMMAND -->  run COMMAND first: what the prose asks
//	                                  for ("start a cluster") or a stand-in file
//	<!-- doctest: nodes N -->         the block starts N nodes (default 1)
//	<!-- doctest: output TEXT -->     after the block, wait until its
//	                                  output shows TEXT
//
// Any other doctest comment, or one not followed by a shell block, is an
// error: a typo never silently turns a check off. A block without
// directives is run.
//
// Steps (steps.go): a block cut into the commands a user would type one
// at a time: a line, with its backslash continuations, and a compound
// command (for ... done, a quoted string over several lines) until bash
// finds it complete (bash -n). A step's trailing comment can say what it
// prints: `# {"key":"a/42","token":1,...}` wants a JSON object with those
// fields on stdout, `# error: CODE ...` wants a non-zero exit status and
// "error: CODE" on stderr.
//
// Session (session.go): one bash process in its own process group,
// reading the steps on its standard input, so variables, exports and cd
// carry over from one step and block to the next as in a terminal. Each
// step's output goes to its own files; a step can be started in the
// background (a server, a watch), its output read while it runs. Close
// reports the background processes that had already exited, stops the
// others with SIGTERM, waits for them, and kills the whole group.
//
// # What it does not own
//
// Which commands run in the background, when a server is ready, how go,
// task and ports are mapped, and the check that every ticketd command
// line of a page parses: those belong to ticketd's binary and live in
// cmd/ticketd/readme_e2e_test.go.
package doctest
