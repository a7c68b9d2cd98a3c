package vmm

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/sled-agent/sled-agent/internal/vmm/spec"
)

// Our view of a VMM (GET /agent/vmms) shows its registration as it came,
// but for what is the tenant's: a blob backend's contents (a cloud-init
// seed holds keys, passwords and scripts) are withheld, their size and
// SHA-256 shown in their place, so that an operator can tell two seeds
// apart without reading either.

// shownRegistration returns body with the contents of every
// blob_storage_backend of its vmm_spec withheld: the component's base64
// is "withheld: <n> bytes, sha256 <hex>" (of the decoded contents). A
// body it cannot read is shown as null rather than risk showing a blob.
func shownRegistration(body json.RawMessage) json.RawMessage {
	if len(body) == 0 {
		return nil
	}
	out, err := withholdBlobs(body)
	if err != nil {
		return json.RawMessage("null")
	}
	return out
}

func withholdBlobs(body json.RawMessage) (json.RawMessage, error) {
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(body, &doc); err != nil {
		return nil, err
	}
	rawSpec, ok := doc["vmm_spec"]
	if !ok || bytes.Equal(rawSpec, []byte("null")) {
		return body, nil
	}
	var vs map[string]json.RawMessage
	if err := json.Unmarshal(rawSpec, &vs); err != nil {
		return nil, err
	}
	rawComps, ok := vs["components"]
	if !ok || bytes.Equal(rawComps, []byte("null")) {
		return body, nil
	}
	var comps map[string]map[string]json.RawMessage
	if err := json.Unmarshal(rawComps, &comps); err != nil {
		return nil, err
	}
	changed := false
	for _, c := range comps {
		var typ string
		if err := json.Unmarshal(c["type"], &typ); err != nil || typ != spec.TypeBlob {
			continue
		}
		var blob map[string]json.RawMessage
		if err := json.Unmarshal(c["component"], &blob); err != nil {
			return nil, err
		}
		var b64 string
		if err := json.Unmarshal(blob["base64"], &b64); err != nil {
			return nil, err
		}
		data, err := base64.StdEncoding.DecodeString(b64)
		if err != nil {
			// Validated at registration; an adopted record is shown
			// withheld all the same.
			data = []byte(b64)
		}
		sum := sha256.Sum256(data)
		blob["base64"] = mustMarshal(fmt.Sprintf("withheld: %d bytes, sha256 %s", len(data), hex.EncodeToString(sum[:])))
		c["component"] = mustMarshal(blob)
		changed = true
	}
	if !changed {
		return body, nil
	}
	vs["components"] = mustMarshal(comps)
	doc["vmm_spec"] = mustMarshal(vs)
	return json.Marshal(doc)
}

func mustMarshal(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic("vmm: marshalling a decoded value: " + err.Error())
	}
	return b
}
