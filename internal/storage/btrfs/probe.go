package btrfs

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"strings"

	"github.com/google/uuid"

	"github.com/sled-agent/sled-agent/internal/storage"
)

// content is what a disk holds.
type content struct {
	kind   storage.Content
	poolID string // kind pool
	what   string // kind foreign: what was found
	// halfMade (kind pool): mkfs.btrfs was stopped before it finished,
	// leaving its temporary superblock (superMagicTemp) for our pool.
	halfMade bool
}

// headSize is how much of a disk is read to tell what it holds: the
// partition tables and the signatures of every common filesystem, and
// btrfs's first superblock (at 64 KiB), are in the first MiB.
const headSize = 1 << 20

// btrfs superblock layout (fs/btrfs/ondisk: struct btrfs_super_block).
const (
	superOffset    = 64 << 10
	superSize      = 4096
	superCsumLen   = 32
	superFsidAt    = 0x20
	superMagicAt   = 0x40
	superCsumType  = 0xc4
	superLabelAt   = 0x12b
	superLabelSize = 256
	superMagic     = "_BHRfS_M"
	// superMagicTemp is the magic mkfs.btrfs writes first and replaces
	// with superMagic only once the filesystem is whole: a disk whose mkfs
	// was killed holds it (seen here with btrfs-progs 6.2: blkid finds
	// nothing on such a disk).
	superMagicTemp = "!BHRfS_M"
)

// probe tells what the disk at path holds, reading and never writing:
//   - one of our pools: a btrfs filesystem (valid superblock) labelled
//     "oxp_<its filesystem UUID>"; or one whose making was cut short (a
//     crash of the agent during mkfs.btrfs): mkfs's temporary superblock,
//     with that label. No one else writes our label, and a half-made
//     filesystem holds nothing, so OpenPool makes it again;
//   - foreign: any other btrfs filesystem, anything blkid's low-level
//     probe recognises (a filesystem, a partition table, a RAID or LUKS
//     member, anywhere on the disk), or, beyond upstream's rule, any data
//     in the first MiB that nothing recognises (a disk wiped of its
//     signatures only is not taken to be blank: zero its first MiB to
//     reuse it);
//   - blank: none of those.
//
// The superblock is read first, alone: a disk that holds one (every pool's,
// in every listing of the disks) is told by it, and the first MiB is read
// only for a disk that has none.
func (b *Backend) probe(ctx context.Context, path string) (content, error) {
	head, err := syscallOn(ctx, b, path, func() ([]byte, error) { return readHeadN(path, superOffset+superSize) })
	if err != nil {
		return content{}, err
	}
	if fsid, label, temp, ok := parseSuper(head); ok {
		switch {
		case label == poolLabel(fsid):
			return content{kind: storage.ContentPool, poolID: fsid, halfMade: temp}, nil
		case temp:
			return content{kind: storage.ContentForeign, what: fmt.Sprintf("a half-made btrfs filesystem %s labelled %q", fsid, label)}, nil
		}
		return content{kind: storage.ContentForeign, what: fmt.Sprintf("btrfs filesystem %s labelled %q", fsid, label)}, nil
	}
	out, err := b.command(ctx, "blkid", "-p", "-o", "export", path)
	var ce *CommandError
	switch {
	case err == nil:
		return content{kind: storage.ContentForeign, what: describeBlkid(out)}, nil
	case errors.As(err, &ce) && ce.ExitCode() == 2: // nothing found
	default:
		return content{}, fmt.Errorf("probe %s: %w", path, err)
	}
	// Nothing recognised: the first MiB must be zero.
	head, err = syscallOn(ctx, b, path, func() ([]byte, error) { return readHead(path) })
	if err != nil {
		return content{}, err
	}
	if i := bytes.IndexFunc(head, func(r rune) bool { return r != 0 }); i >= 0 {
		return content{kind: storage.ContentForeign, what: fmt.Sprintf("unrecognised data at byte %d", i)}, nil
	}
	return content{kind: storage.ContentBlank}, nil
}

// readHead reads the first headSize bytes of path (fewer if it is
// smaller). Opening a disk read-only writes nothing to it.
func readHead(path string) ([]byte, error) { return readHeadN(path, headSize) }

// readHeadN reads the first n bytes of path (fewer if it is smaller).
func readHeadN(path string, size int) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	buf := make([]byte, size)
	n, err := io.ReadFull(f, buf)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return buf[:n], nil
}

// parseSuper returns the filesystem UUID and label of a btrfs superblock
// in head, if there is a valid one (magic, and checksum where it is
// crc32c, the default); temp says it is mkfs's temporary one.
func parseSuper(head []byte) (fsid, label string, temp, ok bool) {
	if len(head) < superOffset+superSize {
		return "", "", false, false
	}
	sb := head[superOffset : superOffset+superSize]
	switch string(sb[superMagicAt : superMagicAt+len(superMagic)]) {
	case superMagic:
	case superMagicTemp:
		temp = true
	default:
		return "", "", false, false
	}
	if binary.LittleEndian.Uint16(sb[superCsumType:]) == 0 {
		sum := crc32.Checksum(sb[superCsumLen:], crc32.MakeTable(crc32.Castagnoli))
		if binary.LittleEndian.Uint32(sb[:4]) != sum {
			return "", "", false, false
		}
	}
	u, err := uuid.FromBytes(sb[superFsidAt : superFsidAt+16])
	if err != nil {
		return "", "", false, false
	}
	l := sb[superLabelAt : superLabelAt+superLabelSize]
	if i := bytes.IndexByte(l, 0); i >= 0 {
		l = l[:i]
	}
	return u.String(), string(l), temp, true
}

// describeBlkid says what blkid found, for people: "ext4 filesystem".
func describeBlkid(out []byte) string {
	kv := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			kv[k] = v
		}
	}
	var parts []string
	if t := kv["PTTYPE"]; t != "" {
		parts = append(parts, t+" partition table")
	}
	if t := kv["TYPE"]; t != "" {
		s := t
		if u := kv["USAGE"]; u != "" {
			s += " " + u
		}
		parts = append(parts, s)
	}
	if len(parts) == 0 {
		return "a signature blkid recognises"
	}
	return strings.Join(parts, ", ")
}
