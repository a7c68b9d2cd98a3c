package agent

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/uuid"
)

// hostBoot names this boot of the host, for the VMM records (a VMM's zone
// does not outlive the boot it was made in): a digest of the kernel's boot
// id and, with the Linux runtime, of a token kept in its run dir, made when
// missing. A reboot changes the kernel's id and empties the run dir (a
// tmpfs, as /run is); a host taken down without its kernel restarting (its
// processes killed, its namespaces and mounts gone, /run emptied: the
// crash test's simulated reboot) empties the run dir. Either is a new boot.
func hostBoot(cfg Config) (string, error) {
	kernel, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", fmt.Errorf("reading the kernel's boot id: %w", err)
	}
	token := ""
	if cfg.Runtime == "linux" {
		if token, err = bootToken(filepath.Join(cmp.Or(cfg.RunDir, DefaultRunDir), cmp.Or(cfg.ZoneTag, DefaultZoneTag)+".boot")); err != nil {
			return "", err
		}
	}
	sum := sha256.Sum256([]byte(strings.TrimSpace(string(kernel)) + "/" + token))
	return hex.EncodeToString(sum[:8]), nil
}

// bootToken reads the token at path, or makes it.
func bootToken(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err == nil {
		if t := strings.TrimSpace(string(data)); uuid.Validate(t) == nil {
			return t, nil
		}
		// A damaged token names no boot: a new one does (its VMMs' zones
		// are looked at as they are: gone, they fail).
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("reading this boot's token: %w", err)
	}
	t := uuid.NewString()
	if err := os.WriteFile(path, []byte(t+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("keeping this boot's token: %w", err)
	}
	return t, nil
}
