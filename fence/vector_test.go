package fence

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// vector is the test vector of docs/fencing.md, read from the page, so the
// page and the code cannot drift apart.
type vector struct {
	seed, publicKey, keyID, clusterID, key, token, payload, fence string
}

func readVector(t *testing.T) vector {
	t.Helper()
	doc, err := os.ReadFile("../docs/fencing.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := bytes.Cut(doc, []byte("## Test vector"))
	if !ok {
		t.Fatal(`docs/fencing.md has no "## Test vector" section`)
	}
	fields := map[string]string{}
	line := regexp.MustCompile(`^([a-z ]+):\s+(\S+)$`)
	sc := bufio.NewScanner(bytes.NewReader(after))
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "## ") {
			break
		}
		if m := line.FindStringSubmatch(sc.Text()); m != nil {
			fields[m[1]] = m[2]
		}
	}
	v := vector{fields["seed"], fields["public key"], fields["key id"], fields["cluster id"], fields["key"], fields["token"], fields["payload"], fields["fence"]}
	for name, val := range fields {
		if val == "" {
			t.Fatalf("test vector field %q is empty", name)
		}
	}
	if len(fields) != 8 {
		t.Fatalf("docs/fencing.md's test vector has fields %v, want the 8 of the vector", fields)
	}
	return v
}

// TestVector signs the documented inputs and checks every documented
// output: Ed25519 signatures are deterministic, so the fence is too.
func TestVector(t *testing.T) {
	v := readVector(t)
	seed, err := hex.DecodeString(v.seed)
	if err != nil || len(seed) != ed25519.SeedSize {
		t.Fatalf("seed %q: %v", v.seed, err)
	}
	priv := ed25519.NewKeyFromSeed(seed)
	pub, _ := PublicKeyFromPrivate(priv)
	cluster, err := ParseClusterID(v.clusterID)
	if err != nil {
		t.Fatal(err)
	}
	token, err := strconv.ParseUint(v.token, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	s := mustSign(t, priv, cluster, v.key, token)
	p, _ := base64.RawURLEncoding.DecodeString(strings.Split(s, ".")[1])
	for _, c := range []struct{ what, got, want string }{
		{"public key", pub.String(), v.publicKey},
		{"key id", pub.ID().String(), v.keyID},
		{"payload", hex.EncodeToString(p), v.payload},
		{"fence", s, v.fence},
	} {
		if c.got != c.want {
			t.Errorf("%s: computed %s, docs/fencing.md says %s", c.what, c.got, c.want)
		}
	}
	verifier, _ := NewVerifier(cluster, pub)
	if f, err := verifier.Verify(v.fence); err != nil || f.Key != v.key || f.Token != token {
		t.Fatalf("the documented fence: %+v, %v", f, err)
	}
}

// TestKeyLimitMatchesProtocol: MaxKeyLen is ticketd's key limit, which
// this package may not import (it imports no server code); the protocol
// page states it.
func TestKeyLimitMatchesProtocol(t *testing.T) {
	doc, err := os.ReadFile("../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	want := "| `key` | string | 1 to **" + strconv.Itoa(MaxKeyLen) + " bytes**, valid UTF-8, no NUL byte |"
	if !bytes.Contains(doc, []byte(want)) {
		t.Fatalf("docs/protocol.md does not state the key limit as %q: if ticketd's key limit changed, change MaxKeyLen, the fence format's version and docs/fencing.md", want)
	}
}

// TestNodeVerifier runs testdata/verify.mjs, an implementation of
// docs/fencing.md's verification steps in JavaScript with only Node.js's
// crypto, on the test vector and on forged, malformed and foreign fences:
// its verdicts must be the Go verifier's.
func TestNodeVerifier(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node not found on PATH: install Node.js (Debian: apt-get install nodejs) to check the fence format with a verifier that is not Go")
	}
	v := readVector(t)
	cluster, _ := ParseClusterID(v.clusterID)
	docKey, _ := ParsePublicKey(v.publicKey)
	priv, pub := testKey(t, 7)
	otherPriv, _ := testKey(t, 99)
	verifier, err := NewVerifier(cluster, docKey, pub)
	if err != nil {
		t.Fatal(err)
	}
	good := mustSign(t, priv, cluster, "jobs/é/1", 1<<62)
	parts := strings.Split(good, ".")
	e := base64.RawURLEncoding
	payload, _ := e.DecodeString(parts[1])
	sig, _ := e.DecodeString(parts[2])
	sig[0] ^= 0x80
	fences := []string{
		v.fence,
		good,
		mustSign(t, priv, cluster, strings.Repeat("k", MaxKeyLen), ^uint64(0)),
		"tf1." + parts[1] + "." + e.EncodeToString(sig),                      // forged signature
		mustSign(t, otherPriv, cluster, "jobs/1", 5),                         // unknown key
		mustSign(t, priv, cluster^1, "jobs/1", 5),                            // another cluster
		signRaw(priv, payload[:len(payload)-1]),                              // key length says one more byte
		signRaw(priv, append(payload, 'x')),                                  // trailing byte
		signRaw(priv, payload2(payload, 0, 2)),                               // version byte 2
		"tf2." + parts[1] + "." + parts[2],                                   // unknown version
		"tf1." + parts[1] + "." + parts[2] + ".",                             // trailing dot
		"tf1." + parts[1] + "=." + parts[2],                                  // padding
		"tf1." + parts[1] + "." + parts[2][:85] + nonCanonical(parts[2][85]), // unused bits set
		"tf1." + strings.ReplaceAll(parts[1], "_", "/") + "." + parts[2],
		"",
		"tf1",
		good + strings.Repeat("A", MaxLen-len(good)+1), // one byte too long
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "testdata/verify.mjs", FormatClusterID(cluster), docKey.String(), pub.String())
	cmd.Stdin = strings.NewReader(strings.Join(fences, "\n") + "\n")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node verify.mjs: %v\n%s", err, stderr.String())
	}
	verdicts := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(verdicts) != len(fences) {
		t.Fatalf("node gave %d verdicts for %d fences:\n%s", len(verdicts), len(fences), out)
	}
	for i, s := range fences {
		var got struct {
			OK        bool   `json:"ok"`
			Code      Code   `json:"code"`
			ClusterID string `json:"cluster_id"`
			Key       string `json:"key"`
			Token     string `json:"token"`
			KeyID     string `json:"key_id"`
		}
		if err := json.Unmarshal([]byte(verdicts[i]), &got); err != nil {
			t.Fatalf("verdict %q: %v", verdicts[i], err)
		}
		f, err := verifier.Verify(s)
		switch {
		case err != nil && (got.OK || got.Code != CodeOf(err)):
			t.Errorf("fence %d %q: Go says %v, node says %s", i, s, err, verdicts[i])
		case err == nil && (!got.OK || got.ClusterID != FormatClusterID(f.ClusterID) || got.Key != f.Key ||
			got.Token != strconv.FormatUint(f.Token, 10) || got.KeyID != f.KeyID.String()):
			t.Errorf("fence %d %q: Go says %+v, node says %s", i, s, f, verdicts[i])
		}
	}
}

// payload2 is p with byte i set to b.
func payload2(p []byte, i int, b byte) []byte {
	q := append([]byte(nil), p...)
	q[i] = b
	return q
}

// nonCanonical returns the base64url character c with its lowest bit set
// (c must have it clear): in a 64-byte signature's last character that
// bit is unused.
func nonCanonical(c byte) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	return string(alphabet[strings.IndexByte(alphabet, c)|1])
}
