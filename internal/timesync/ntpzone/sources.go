package ntpzone

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"strconv"
	"strings"
)

// readSources reads the servers of an internal zone's sources file, as
// chrony.SetServers writes it ("server <addr> … [port <n>]" lines): the
// addresses, and their port when it is not 123 (all lines have the same:
// chrony.Config has one ServerPort). A missing file is no servers. Lines
// that are not server lines are skipped; a server line that cannot be read
// is an error, and the servers read from the others are returned with it.
func readSources(path string) ([]netip.Addr, uint16, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("sources file: %w", err)
	}
	var servers []netip.Addr
	var port uint16
	var errs []error
	sc := bufio.NewScanner(bytes.NewReader(data))
lines:
	for n := 1; sc.Scan(); n++ {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || f[0] != "server" {
			continue
		}
		bad := func(why string) { errs = append(errs, fmt.Errorf("%s:%d: %s: %q", path, n, why, sc.Text())) }
		if len(f) < 2 {
			bad("no address")
			continue
		}
		a, err := netip.ParseAddr(f[1])
		if err != nil || a.Zone() != "" {
			bad("not an address")
			continue
		}
		p := uint16(0)
		for i := 2; i+1 < len(f); i++ {
			if f[i] == "port" {
				v, err := strconv.ParseUint(f[i+1], 10, 16)
				if err != nil || v == 0 {
					bad("bad port")
					continue lines
				}
				p = uint16(v)
			}
		}
		if p == 123 {
			p = 0
		}
		if len(servers) > 0 && p != port {
			bad("a port unlike the other servers'")
			continue
		}
		port = p
		servers = appendNew(servers, a.Unmap())
	}
	if err := sc.Err(); err != nil {
		errs = append(errs, fmt.Errorf("sources file: %w", err))
	}
	return servers, port, errors.Join(errs...)
}
