package zonenet

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
)

// Looking a host link up by name through netlink takes the kernel's RTNL
// lock, which every link change on the machine holds, often for a long time
// (deleting a link waits out RCU grace periods): with many zones torn down
// at once, the lookups that prove a link ours spin on that lock and cost
// more than the deletions. /sys/class/net answers the same question (the
// link's index and alias) without the lock, when it shows the agent's own
// namespace, which sysfsShowsUs checks once.
var sysfsNet struct {
	once sync.Once
	ok   bool
}

const sysClassNet = "/sys/class/net/"

// hostLinkMark returns the index and alias of the host link called name, or
// index 0 if there is none.
func hostLinkMark(h *netlink.Handle, name string) (index int, alias string, err error) {
	if err := checkLinkName(name); err != nil {
		return 0, "", err // whichever way the link is looked up
	}
	sysfsNet.once.Do(func() {
		// Links made or deleted between the two looks (other zones',
		// other processes') make them differ for a moment: look again
		// before settling on netlink for good.
		for range 3 {
			if sysfsNet.ok = sysfsShowsUs(h); sysfsNet.ok {
				break
			}
		}
	})
	if !sysfsNet.ok {
		l, err := linkByName(h, name)
		if err != nil || l == nil {
			return 0, "", err
		}
		return l.Attrs().Index, l.Attrs().Alias, nil
	}
	index, err = sysfsIndex(name)
	if err != nil || index == 0 {
		return 0, "", err
	}
	b, err := os.ReadFile(sysClassNet + name + "/ifalias")
	if errors.Is(err, fs.ErrNotExist) {
		return 0, "", nil // gone since
	}
	if err != nil {
		return 0, "", fmt.Errorf("reading the alias of %s: %w", name, err)
	}
	return index, strings.TrimSuffix(string(b), "\n"), nil
}

// sysfsIndex returns the index of link name as /sys/class/net shows it, or
// 0 if it shows none.
func sysfsIndex(name string) (int, error) {
	if err := checkLinkName(name); err != nil {
		return 0, err
	}
	b, err := os.ReadFile(sysClassNet + name + "/ifindex")
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("reading the index of %s: %w", name, err)
	}
	index, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("reading the index of %s: %w", name, err)
	}
	return index, nil
}

// sysfsShowsUs reports whether /sys/class/net shows the links of the
// namespace h works in (sysfs shows those of the namespace it was mounted
// from): the same links, under the same indexes, both ways. A link created
// or deleted meanwhile is looked up again.
func sysfsShowsUs(h *netlink.Handle) bool {
	links, err := h.LinkList()
	if err != nil || len(links) == 0 {
		return false
	}
	ents, err := os.ReadDir(sysClassNet)
	if err != nil {
		return false
	}
	listed := make(map[string]bool, len(links))
	for _, l := range links {
		listed[l.Attrs().Name] = true
	}
	for _, e := range ents {
		if listed[e.Name()] {
			continue
		}
		index, err := sysfsIndex(e.Name())
		switch {
		case err != nil:
			return false
		case index == 0:
			continue // deleted since it was listed
		}
		if l, err := h.LinkByName(e.Name()); err != nil || l.Attrs().Index != index {
			if now, err := sysfsIndex(e.Name()); err == nil && now != index {
				continue // deleted (or made again) meanwhile
			}
			return false // sysfs has it and netlink does not
		}
	}
	for _, l := range links {
		index, err := sysfsIndex(l.Attrs().Name)
		switch {
		case err != nil:
			return false
		case index == l.Attrs().Index:
		case index == 0:
			if _, err := h.LinkByIndex(l.Attrs().Index); err == nil {
				return false // netlink has it and sysfs does not
			}
		default:
			return false
		}
	}
	return true
}

// checkLinkName refuses a link name that is no name of a file in sysfs's
// net directory.
func checkLinkName(name string) error {
	if name == "" || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
		return fmt.Errorf("%w: link name %q", ErrInvalid, name)
	}
	return nil
}
