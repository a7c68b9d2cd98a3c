// Package qemu turns a machine description into a running QEMU and talks
// QMP to it.
//
// A [Machine] is a plain description of a guest (board, firmware, disks,
// NICs, serial ports) with no knowledge of any wire format; [Machine.Args]
// validates it and renders QEMU's command line. [Start] runs that command,
// waits for its QMP socket and returns a [Process] with a [Monitor] on it.
// [ChooseAccel] decides between KVM and TCG from what the host really has.
// With [Machine.Descriptors] QEMU opens nothing by path: Start opens its
// files and makes its sockets and QEMU is given the descriptors, and
// [OpenTap] makes a NIC's tap for it, so that QEMU can run as a user who
// may reach none of them.
//
// # Why a QMP client of our own
//
// github.com/digitalocean/go-qemu/qmp was evaluated first, as the project
// prefers a well-kept library made for the job. Its SocketMonitor cannot meet
// this package's rules:
//
//   - Connect and Run take no context: reading the greeting and waiting for
//     a reply have no deadline, so a QEMU that stops answering blocks the
//     caller forever.
//   - Run holds a mutex across the write and the wait for the reply, so one
//     stuck command blocks every other caller behind the lock.
//   - Commands carry no id: a reply that arrives after its caller gave up
//     would be taken as the next command's reply.
//   - Events go through an unbuffered channel from the one reader goroutine,
//     so a caller that does not read events also stops replies; events that
//     arrive before Events is called are dropped.
//   - QMP errors lose their class (errors.New(desc)), and replies longer than
//     bufio.Scanner's 64 KiB token (query-qmp-schema) break the connection.
//
// The client here ([Dial], [Monitor]) is small: one reader goroutine that
// never blocks on a caller, one writer goroutine so that a half-written
// command is never abandoned, ids on every command, a deadline on every call
// and a queue for events.
package qemu
