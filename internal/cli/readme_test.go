package cli

import (
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/sled-agent/sled-agent/internal/runtime/sim"
)

// jsonBlock is a ```json block of a Markdown file: its body and the line
// its fence is on.
var jsonBlock = regexp.MustCompile("(?ms)^```json\n(.*?)^```")

// repoRoot is the repository's root, from this package's directory.
var repoRoot = filepath.Join("..", "..")

// docFiles returns the repository's README.md and every docs/*.md, as paths
// relative to the repository's root.
func docFiles(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files := []string{"README.md"}
	for _, d := range docs {
		rel, err := filepath.Rel(repoRoot, d)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, filepath.ToSlash(rel))
	}
	sort.Strings(files[1:])
	return files
}

// readFile returns the content of name, a path relative to the repository's
// root.
func readFile(t *testing.T, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, filepath.FromSlash(name)))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// lineOf returns the line offset off of data is on.
func lineOf(data []byte, off int) int {
	line := 1
	for _, c := range data[:off] {
		if c == '\n' {
			line++
		}
	}
	return line
}

// markdownBlocks returns the ```json blocks of the Markdown file name (a
// path relative to the repository's root) by the line they start on.
func markdownBlocks(t *testing.T, name string) map[int][]byte {
	t.Helper()
	data := readFile(t, name)
	out := map[int][]byte{}
	for _, m := range jsonBlock.FindAllSubmatchIndex(data, -1) {
		out[lineOf(data, m[0])] = data[m[2]:m[3]]
	}
	return out
}

// isAgentConfig reports whether doc's keys are those of an agent config
// file (--config): a key that is a run flag, or images.
func isAgentConfig(doc map[string]json.RawMessage) bool {
	flags := newRunCmd().Flags()
	for key := range doc {
		if fl := flags.Lookup(key); (fl != nil && fl.Annotations[configKey] != nil) || key == "images" {
			return true
		}
	}
	return false
}

// isFaultMap reports whether doc's keys are a sim fault map's.
func isFaultMap(doc map[string]json.RawMessage) bool {
	for key := range doc {
		switch key {
		case "zones", "disks", "timesync":
		default:
			return false
		}
	}
	return len(doc) > 0
}

// Every ```json block of the README and of docs/*.md parses as JSON, and one
// of a kind the agent reads is accepted by the code that reads it: an agent
// config file (--config) as run resolves it, with its images as the agent
// checks them; a sim fault map (--sim-faults, PUT /debug/sim/faults) as the
// sim parses it.
func TestReadmeJSONBlocks(t *testing.T) {
	files := docFiles(t)
	total, configs, faultMaps := 0, 0, 0
	for _, name := range files {
		blocks := markdownBlocks(t, name)
		total += len(blocks)
		for line, block := range blocks {
			var v any
			if err := json.Unmarshal(block, &v); err != nil {
				t.Errorf("%s:%d: not JSON: %v", name, line, err)
				continue
			}
			doc, ok := v.(map[string]any)
			if !ok {
				continue
			}
			raw := map[string]json.RawMessage{}
			for k := range doc {
				raw[k] = nil
			}
			switch {
			case isAgentConfig(raw):
				configs++
				path := filepath.Join(t.TempDir(), "agent.json")
				if err := os.WriteFile(path, block, 0o600); err != nil {
					t.Fatal(err)
				}
				cfg, _, err := resolveWith("--config", path)
				if err != nil {
					t.Errorf("%s:%d: an agent config file run refuses: %v", name, line, err)
					continue
				}
				if err := cfg.Images.Validate(); err != nil {
					t.Errorf("%s:%d: an agent config file whose images the agent refuses: %v", name, line, err)
				}
			case isFaultMap(raw):
				faultMaps++
				if _, err := sim.ParseFaults(block); err != nil {
					t.Errorf("%s:%d: a fault map the sim refuses: %v", name, line, err)
				}
			}
		}
	}
	if total == 0 {
		t.Fatalf("no ```json block in %v: is this the repository's README and docs?", files)
	}
	if configs == 0 {
		t.Errorf("no agent config file block in %v: the images paragraph shows one", files)
	}
	if faultMaps == 0 {
		t.Errorf("no sim fault map block in %v: the simulated faults section shows one", files)
	}
}

// mdLink is an inline Markdown link or image: its target, up to an optional
// title.
var mdLink = regexp.MustCompile(`!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)

// fencedCode is a fenced code block, whose text is not Markdown.
var fencedCode = regexp.MustCompile("(?ms)^```.*?^```")

// Every relative link of the README and of docs/*.md points to a file or
// directory that exists in the repository (its #fragment aside).
func TestReadmeLinks(t *testing.T) {
	files := docFiles(t)
	if len(files) < 2 {
		t.Fatalf("no docs/*.md beside README.md: %v", files)
	}
	links := 0
	for _, name := range files {
		data := readFile(t, name)
		// Blank out code blocks, keeping offsets, so that their text is
		// not read as links.
		text := fencedCode.ReplaceAllFunc(append([]byte(nil), data...), func(b []byte) []byte {
			return []byte(strings.Map(func(r rune) rune {
				if r == '\n' {
					return r
				}
				return ' '
			}, string(b)))
		})
		for _, m := range mdLink.FindAllSubmatchIndex(text, -1) {
			target := string(text[m[2]:m[3]])
			line := lineOf(text, m[0])
			u, err := url.Parse(target)
			if err != nil {
				t.Errorf("%s:%d: link %q: %v", name, line, target, err)
				continue
			}
			if u.Scheme != "" || u.Host != "" || strings.HasPrefix(target, "//") {
				continue // not relative
			}
			if u.Path == "" {
				continue // a fragment of the file itself
			}
			links++
			if strings.HasPrefix(u.Path, "/") {
				t.Errorf("%s:%d: link %q is absolute in the repository: make it relative", name, line, target)
				continue
			}
			path := filepath.Join(repoRoot, filepath.Dir(filepath.FromSlash(name)), filepath.FromSlash(u.Path))
			if _, err := os.Stat(path); err != nil {
				t.Errorf("%s:%d: link %q points to no file: %v", name, line, target, err)
			}
		}
	}
	if links == 0 {
		t.Errorf("no relative link in %v: the README links its docs", files)
	}
}
