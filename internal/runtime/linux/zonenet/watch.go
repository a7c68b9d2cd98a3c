package zonenet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/sled-agent/sled-agent/internal/inotify"
)

// Event kinds.
const (
	EventNetnsCreated = "netns-created" // a file appeared in /run/netns (it may not be mounted yet)
	EventNetnsDeleted = "netns-deleted"
	EventLinkDeleted  = "link-deleted"
	EventResync       = "resync" // a kernel queue overflowed and events were lost: list again
)

// Event is one change Watch saw.
type Event struct {
	Kind string
	// Name is the namespace's or the host link's name ("" for EventResync).
	Name string
	// ZoneID is the link's zone from its alias; for a namespace, the UUID
	// its name ends with, if it ends with one.
	ZoneID string
}

// Watch reports, until ctx ends, namespaces whose names start with
// netnsPrefix appearing in or vanishing from /run/netns (inotify), and host
// links marked as tag's being deleted (netlink). notify is called on Watch's
// goroutine, one event at a time; it should return quickly. Watch returns nil
// when ctx ends, or an error if it cannot watch (then nothing is watched: the
// caller restarts it and relists, as it must anyway to catch what happened
// in between).
func Watch(ctx context.Context, netnsPrefix, tag string, notify func(Event)) error {
	if err := validNetnsPrefix(netnsPrefix); err != nil {
		return err
	}
	if err := validTag(tag); err != nil {
		return err
	}
	if err := prepareNetnsDir(); err != nil {
		return fmt.Errorf("zonenet: watch: %w", err)
	}
	dir, err := watchDir(netnsDir)
	if err != nil {
		return fmt.Errorf("zonenet: watch: %w", err)
	}
	sock, err := nl.Subscribe(unix.NETLINK_ROUTE, unix.RTNLGRP_LINK)
	if err != nil {
		dir.Close()
		return fmt.Errorf("zonenet: watch: subscribing to link updates: %w", err)
	}
	// A larger queue makes an overflow (and so a resync) rarer; best effort.
	_ = sock.SetReceiveBufferSize(1<<20, false)

	ctx, cancel := context.WithCancel(ctx)
	events := make(chan Event)
	emit := func(e Event) {
		select {
		case events <- e:
		case <-ctx.Done():
		}
	}
	errc := make(chan error, 2)
	var wg sync.WaitGroup
	wg.Go(func() {
		<-ctx.Done()
		dir.Close() // ends the blocked reads below
		sock.Close()
	})
	wg.Go(func() { errc <- readDirEvents(ctx, dir, netnsPrefix, emit) })
	wg.Go(func() { errc <- readLinkEvents(ctx, sock, tag, emit) })
	defer func() {
		cancel()
		wg.Wait()
	}()
	for {
		select {
		case e := <-events:
			notify(e)
		case err := <-errc:
			if err != nil {
				return fmt.Errorf("zonenet: watch: %w", err)
			}
		case <-ctx.Done():
			return nil
		}
	}
}

func watchDir(path string) (*os.File, error) {
	return inotify.Watch(path, unix.IN_CREATE|unix.IN_DELETE|unix.IN_MOVED_FROM|unix.IN_MOVED_TO|unix.IN_DELETE_SELF)
}

// readDirEvents turns inotify events on /run/netns into Events until ctx ends
// (nil) or the watch breaks (an error).
func readDirEvents(ctx context.Context, f *os.File, prefix string, emit func(Event)) error {
	buf := make([]byte, inotify.BufferSize)
	for {
		n, err := f.Read(buf)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading inotify: %w", err)
		}
		for ev := range inotify.Events(buf[:n]) {
			mask, name := ev.Mask, ev.Name
			switch {
			case mask&unix.IN_Q_OVERFLOW != 0:
				emit(Event{Kind: EventResync})
			case mask&(unix.IN_DELETE_SELF|unix.IN_IGNORED|unix.IN_UNMOUNT) != 0:
				return fmt.Errorf("%s was removed; its watch is gone", netnsDir)
			case !strings.HasPrefix(name, prefix) || name == "":
			case mask&(unix.IN_DELETE|unix.IN_MOVED_FROM) != 0:
				emit(Event{Kind: EventNetnsDeleted, Name: name, ZoneID: trailingUUID(name)})
			case mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0:
				emit(Event{Kind: EventNetnsCreated, Name: name, ZoneID: trailingUUID(name)})
			}
		}
	}
}

// readLinkEvents turns deletions of tag's host links into Events until ctx
// ends (nil) or the socket breaks (an error).
func readLinkEvents(ctx context.Context, sock *nl.NetlinkSocket, tag string, emit func(Event)) error {
	for {
		msgs, from, err := sock.Receive()
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, unix.ENOBUFS) {
			emit(Event{Kind: EventResync})
			continue
		}
		if err != nil {
			return fmt.Errorf("receiving link updates: %w", err)
		}
		if from.Pid != nl.PidKernel {
			continue
		}
		for _, m := range msgs {
			if m.Header.Type != unix.RTM_DELLINK {
				continue
			}
			hdr := unix.NlMsghdr(m.Header)
			l, err := netlink.LinkDeserialize(&hdr, m.Data)
			if err != nil {
				continue // not a link we could mark
			}
			if t, id, _, ok := parseAlias(l.Attrs().Alias); ok && t == tag {
				emit(Event{Kind: EventLinkDeleted, Name: l.Attrs().Name, ZoneID: id})
			}
		}
	}
}

// trailingUUID returns the UUID that name ends with after a '_', or "".
func trailingUUID(name string) string {
	i := len(name) - 36
	if i < 1 || name[i-1] != '_' || validZoneID(name[i:]) != nil {
		return ""
	}
	return strings.ToLower(name[i:])
}
