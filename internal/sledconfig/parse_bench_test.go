package sledconfig_test

import (
	"encoding/json"
	"testing"

	"github.com/sled-agent/sled-agent/internal/sledconfig"
	"github.com/sled-agent/sled-agent/internal/sledconfig/sledconfigtest"
)

// BenchmarkParseValidate1000 is the decoding and validation part of a PUT of a
// 1,000-zone config.
func BenchmarkParseValidate1000(b *testing.B) {
	doc, err := json.Marshal(sledconfigtest.Config(1, sledconfigtest.Crucibles(1000)...))
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(doc)))
	for b.Loop() {
		cfg, err := sledconfig.Parse(doc)
		if err != nil {
			b.Fatal(err)
		}
		if err := sledconfig.Validate(cfg); err != nil {
			b.Fatal(err)
		}
	}
}
