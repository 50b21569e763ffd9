package natsclient

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/spf13/pflag"
)

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"nats://127.0.0.1:4222":                           "nats://127.0.0.1:4222",
		"nats://alice:s3cret@127.0.0.1:4222":              "nats://alice:REDACTED@127.0.0.1:4222",
		"nats://tok3n@h:4222":                             "nats://REDACTED@h:4222",
		"nats://a:b@h1:1, tls://c:d@h2:2":                 "nats://a:REDACTED@h1:1,tls://c:REDACTED@h2:2",
		"nats://a:%zz@h:1":                                "nats://REDACTED@h:1", // does not parse
		"a:b@h:1":                                         "REDACTED@h:1",
		"nats://u:p@ss@h:1":                               "nats://u:REDACTED@h:1",
		"nats://127.0.0.1:4222,nats://x:hunter2@h:4222/x": "nats://127.0.0.1:4222,nats://x:REDACTED@h:4222/x",
	} {
		got := Redact(in)
		if got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
		for _, secret := range []string{"s3cret", "tok3n", "hunter2", "%zz", ":p@ss"} {
			if strings.Contains(got, secret) {
				t.Errorf("Redact(%q) = %q still holds %q", in, got, secret)
			}
		}
	}
}

func TestAuthValidate(t *testing.T) {
	for name, a := range map[string]Auth{
		"two methods":      {CredsFile: "c", User: "u"},
		"password no user": {Password: "p"},
		"cert without key": {TLSCert: "c"},
		"wildcard inbox":   {InboxPrefix: "_INBOX.>"},
	} {
		if _, err := a.Options(); !errors.Is(err, ErrAuth) {
			t.Errorf("%s: Options = %v, want ErrAuth", name, err)
		}
	}
	opts, err := Auth{User: "u", Password: "p", TLSCA: "ca.pem", InboxPrefix: "_INBOX.u"}.Options()
	if err != nil || len(opts) != 3 {
		t.Fatalf("Options = %d options, %v", len(opts), err)
	}
}

// The password never comes from a flag: from the file, else the
// environment.
func TestFlagsPassword(t *testing.T) {
	dir := t.TempDir()
	pw := filepath.Join(dir, "pw")
	if err := os.WriteFile(pw, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := func(k string) string {
		if k == PasswordEnv {
			return "from-env"
		}
		return ""
	}
	for _, tc := range []struct {
		args []string
		env  func(string) string
		want string
		bad  bool
	}{
		{[]string{"--nats-user", "alice"}, env, "from-env", false},
		{[]string{"--nats-user", "alice", "--nats-password-file", pw}, func(string) string { return "" }, "from-file", false},
		// A file and the variable that differ: refused, as serve does.
		{[]string{"--nats-user", "alice", "--nats-password-file", pw}, env, "", true},
		{nil, env, "", false}, // no user: the variable is not read
	} {
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		build := Flags(fs, tc.env)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		a, err := build()
		if (err != nil) != tc.bad || a.Password != tc.want {
			t.Errorf("%v: password %q, %v; want %q", tc.args, a.Password, err, tc.want)
		}
	}
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	Flags(fs, env)
	if fs.Lookup("nats-password") != nil {
		t.Fatal("a --nats-password flag would put the secret on argv")
	}
	empty := filepath.Join(dir, "empty")
	_ = os.WriteFile(empty, nil, 0o600)
	if _, err := ReadSecretFile(empty); err == nil {
		t.Fatal("an empty secret file was accepted")
	}
}

// A refused connection keeps its OS error: nats.go alone says only "no
// servers available for connection".
func TestDialRecorderExplainsNoServers(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	var d DialRecorder
	_, err = nats.Connect("nats://"+addr, d.Option(), nats.MaxReconnects(0))
	if !errors.Is(err, nats.ErrNoServers) {
		t.Fatalf("connect to a closed port: %v, want ErrNoServers", err)
	}
	got := d.Explain(err)
	if !errors.Is(got, nats.ErrNoServers) || !strings.Contains(got.Error(), "dial tcp "+addr+": connect: connection refused") {
		t.Fatalf("Explain = %q, want the dial error of %s", got, addr)
	}
	other := errors.New("something else")
	if d.Explain(other) != other {
		t.Fatal("Explain changed an error that is not ErrNoServers")
	}
}

// Every secret resolves the same way: the --NAME-file flag, else the file
// TICKETD_NAME_FILE names, else TICKETD_NAME; a file and TICKETD_NAME that
// differ are refused.
func TestResolveSecret(t *testing.T) {
	dir := t.TempDir()
	flagFile, envFile := filepath.Join(dir, "flag"), filepath.Join(dir, "env")
	_ = os.WriteFile(flagFile, []byte("from-flag-file\n"), 0o600)
	_ = os.WriteFile(envFile, []byte("from-env-file\n"), 0o600)
	for _, tc := range []struct {
		name string
		file string
		env  map[string]string
		want string
		bad  bool
	}{
		{"nothing", "", nil, "", false},
		{"value variable", "", map[string]string{"TICKETD_CONTROL_CREDENTIAL": "v"}, "v", false},
		{"file variable", "", map[string]string{"TICKETD_CONTROL_CREDENTIAL_FILE": envFile}, "from-env-file", false},
		{"flag beats file variable", flagFile, map[string]string{"TICKETD_CONTROL_CREDENTIAL_FILE": envFile}, "from-flag-file", false},
		{"file and value agree", flagFile, map[string]string{"TICKETD_CONTROL_CREDENTIAL": "from-flag-file"}, "from-flag-file", false},
		{"file and value differ", "", map[string]string{"TICKETD_CONTROL_CREDENTIAL_FILE": envFile, "TICKETD_CONTROL_CREDENTIAL": "x"}, "", true},
		{"missing file", filepath.Join(dir, "absent"), nil, "", true},
	} {
		got, err := ResolveSecret("control-credential", tc.file, func(k string) string { return tc.env[k] })
		if (err != nil) != tc.bad || got != tc.want {
			t.Errorf("%s: %q, %v; want %q (error: %v)", tc.name, got, err, tc.want, tc.bad)
		}
		if err != nil && (strings.Contains(err.Error(), "from-env-file") || strings.Contains(err.Error(), "from-flag-file")) {
			t.Errorf("%s: the error shows the secret: %v", tc.name, err)
		}
	}
}

// TICKETD_NATS_PASSWORD_FILE is read like --nats-password-file, and the
// auth method comes from the environment only when no flag chose one.
func TestFlagsEnvironment(t *testing.T) {
	dir := t.TempDir()
	pw := filepath.Join(dir, "pw")
	_ = os.WriteFile(pw, []byte("from-env-file\n"), 0o600)
	env := map[string]string{"TICKETD_NATS_PASSWORD_FILE": pw, "TICKETD_NATS_USER": "bob"}
	for _, tc := range []struct {
		args           []string
		user, password string
		creds          string
	}{
		{nil, "bob", "from-env-file", ""},
		{[]string{"--nats-user", "alice"}, "alice", "from-env-file", ""},
		{[]string{"--nats-creds", "c.creds"}, "", "", "c.creds"},
	} {
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		build := Flags(fs, func(k string) string { return env[k] })
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		a, err := build()
		if err != nil || a.User != tc.user || a.Password != tc.password || a.CredsFile != tc.creds {
			t.Errorf("%v: %+v, %v", tc.args, a, err)
		}
	}
}

func TestHasSecret(t *testing.T) {
	for in, want := range map[string]bool{
		"nats://127.0.0.1:4222":                       false,
		"nats://alice@127.0.0.1:4222":                 true, // nats.go sends a bare user info as the token
		"nats://alice:s3cret@127.0.0.1:4222":          true,
		"nats://127.0.0.1:4222, tls://a:b@h:1":        true,
		"nats://a:%zz@h:1":                            true, // does not parse
		"a:b@h:1":                                     true,
		"nats://u:p@ss@h:1":                           true,
		"nats://127.0.0.1:4222,nats://127.0.0.2:4222": false,
	} {
		if got := HasSecret(in); got != want {
			t.Errorf("HasSecret(%q) = %v, want %v", in, got, want)
		}
	}
}

// A server's token comes from its file or variable, never a flag value,
// and is the method only when no other is chosen.
func TestFlagsToken(t *testing.T) {
	dir := t.TempDir()
	tok := filepath.Join(dir, "token")
	_ = os.WriteFile(tok, []byte("tok-from-file\n"), 0o600)
	for _, tc := range []struct {
		args  []string
		env   map[string]string
		token string
		user  string
		bad   bool
	}{
		{nil, map[string]string{TokenEnv: "tok-env"}, "tok-env", "", false},
		{[]string{"--nats-token-file", tok}, nil, "tok-from-file", "", false},
		{nil, map[string]string{TokenEnv + "_FILE": tok}, "tok-from-file", "", false},
		// Another method chosen: the variable is not read.
		{[]string{"--nats-user", "alice"}, map[string]string{TokenEnv: "tok-env", PasswordEnv: "pw"}, "", "alice", false},
		// Both chosen on the command line: refused.
		{[]string{"--nats-user", "alice", "--nats-token-file", tok}, map[string]string{PasswordEnv: "pw"}, "", "", true},
		// A file and the variable that differ: refused.
		{[]string{"--nats-token-file", tok}, map[string]string{TokenEnv: "other"}, "", "", true},
	} {
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		build := Flags(fs, func(k string) string { return tc.env[k] })
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		a, err := build()
		if (err != nil) != tc.bad || (!tc.bad && (a.Token != tc.token || a.User != tc.user)) {
			t.Errorf("%v %v: token %q user %q, %v", tc.args, tc.env, a.Token, a.User, err)
		}
		if err != nil && strings.Contains(err.Error(), "tok-") {
			t.Errorf("%v: the error shows the token: %v", tc.args, err)
		}
	}
	if opts, err := (Auth{Token: "t"}).Options(); err != nil || len(opts) != 1 {
		t.Fatalf("token Options = %d, %v", len(opts), err)
	}
	if _, err := (Auth{Token: "t", NKeyFile: "k"}).Options(); !errors.Is(err, ErrAuth) {
		t.Fatalf("token and nkey: %v, want ErrAuth", err)
	}
}
