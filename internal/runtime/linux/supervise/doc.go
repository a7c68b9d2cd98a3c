// Package supervise runs a zone's service under runit's runsv, which keeps it
// running whether or not the agent is alive.
//
// A service directory holds a run script written by [Prepare], the log of the
// runsv supervising it (runsv.log, which also receives the service's output),
// the last exit status recorded by the finish script (last-exit) and runsv's
// own supervise/ directory. [Start] starts runsv detached from the agent, in
// its own session, so that the agent may exit or crash while the service goes
// on; [Find] finds that runsv again after an agent restart; [Status] reads the
// state runsv reports; [Stop] takes the service down and makes runsv exit.
//
// Every process of the service carries the environment entry
// MarkerEnv=<service directory>, an ownership mark that survives an agent
// restart and the death of runsv: [Stop] uses it to find the service, and any
// child it left behind, when runsv is no longer there to ask.
package supervise
