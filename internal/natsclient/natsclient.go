package natsclient

import (
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/spf13/pflag"
)

// PasswordEnv is the environment variable the NATS password comes from
// when no file names it: secrets never go on a command line, where `ps`
// shows them to every user of the machine.
const PasswordEnv = "TICKETD_NATS_PASSWORD"

// TokenEnv is the environment variable the NATS authorization token comes
// from when no file names it.
const TokenEnv = "TICKETD_NATS_TOKEN"

// MaxSecretFileBytes bounds a file read for one secret.
const MaxSecretFileBytes = 64 << 10

// Auth is how a client authenticates to NATS and verifies it. The zero
// value is an anonymous, plain connection (a development NATS). At most
// one of CredsFile, NKeyFile, User and Token may be set.
type Auth struct {
	// CredsFile is a NATS credentials file (a user JWT and its nkey seed,
	// as `nsc` writes them).
	CredsFile string
	// NKeyFile is a file holding a user nkey seed ("SU...").
	NKeyFile string
	// User and Password authenticate with a user name and password.
	User     string
	Password string
	// Token authenticates with a server's authorization token (what a
	// URL's bare user info, nats://TOKEN@host, would carry in plain
	// sight).
	Token string
	// TLSCA is a PEM file of the CAs that sign the server's certificate;
	// setting it requires TLS. TLSCert and TLSKey are this client's own
	// certificate and key (servers that verify clients).
	TLSCA   string
	TLSCert string
	TLSKey  string
	// InboxPrefix replaces "_INBOX" in this client's reply subjects, so a
	// server permission can let each user subscribe to its own replies
	// only ("_INBOX.<user>.>"), never to another user's.
	InboxPrefix string
}

// ErrAuth marks every error of Auth.
var ErrAuth = errors.New("natsclient: invalid NATS client settings")

// Validate checks that the settings go together.
func (a Auth) Validate() error {
	n := 0
	for _, set := range []bool{a.CredsFile != "", a.NKeyFile != "", a.User != "", a.Token != ""} {
		if set {
			n++
		}
	}
	switch {
	case n > 1:
		return fmt.Errorf("%w: choose one of nats-creds, nats-nkey, nats-user and a token (nats-token-file)", ErrAuth)
	case a.Password != "" && a.User == "":
		return fmt.Errorf("%w: a NATS password needs nats-user", ErrAuth)
	case (a.TLSCert == "") != (a.TLSKey == ""):
		return fmt.Errorf("%w: nats-tls-cert and nats-tls-key go together", ErrAuth)
	case strings.ContainsAny(a.InboxPrefix, " \t\r\n*>"):
		return fmt.Errorf("%w: nats-inbox-prefix %q is not a literal subject", ErrAuth, a.InboxPrefix)
	}
	return nil
}

// Options returns the nats.go options for a. It reads the nkey seed file
// now (the others are read when connecting).
func (a Auth) Options() ([]nats.Option, error) {
	if err := a.Validate(); err != nil {
		return nil, err
	}
	var opts []nats.Option
	switch {
	case a.CredsFile != "":
		opts = append(opts, nats.UserCredentials(a.CredsFile))
	case a.NKeyFile != "":
		o, err := nats.NkeyOptionFromSeed(a.NKeyFile)
		if err != nil {
			return nil, fmt.Errorf("%w: nats-nkey: %w", ErrAuth, err)
		}
		opts = append(opts, o)
	case a.User != "":
		opts = append(opts, nats.UserInfo(a.User, a.Password))
	case a.Token != "":
		opts = append(opts, nats.Token(a.Token))
	}
	if a.TLSCA != "" {
		opts = append(opts, nats.RootCAs(a.TLSCA))
	}
	if a.TLSCert != "" {
		opts = append(opts, nats.ClientCert(a.TLSCert, a.TLSKey))
	}
	if a.InboxPrefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(a.InboxPrefix))
	}
	return opts, nil
}

// ReadSecretFile reads one secret from path: the whole file, without the
// trailing newline editors add. It fails for an empty or oversize file.
func ReadSecretFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxSecretFileBytes+1))
	if err != nil {
		return "", err
	}
	if len(b) > MaxSecretFileBytes {
		return "", fmt.Errorf("%s is over %d bytes", path, MaxSecretFileBytes)
	}
	s := strings.TrimRight(string(b), "\r\n")
	if s == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return s, nil
}

// Redact returns urls (one URL or a comma-separated list) with the
// password of every URL that has one replaced by "REDACTED", and a bare
// user info (a token) likewise: safe to log or put in an error.
func Redact(urls string) string {
	if !strings.Contains(urls, "@") {
		return urls
	}
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		parts[i] = redactOne(strings.TrimSpace(p))
	}
	return strings.Join(parts, ",")
}

func redactOne(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		if at := strings.LastIndexByte(raw, '@'); at >= 0 {
			// Unparsable but holding something before an '@': hide it all.
			scheme := ""
			if i := strings.Index(raw, "://"); i >= 0 && i < at {
				scheme = raw[:i+3]
			}
			return scheme + "REDACTED@" + raw[at+1:]
		}
		return raw
	}
	if _, hasPassword := u.User.Password(); hasPassword {
		u.User = url.UserPassword(u.User.Username(), "REDACTED")
	} else {
		u.User = url.User("REDACTED") // a token in the user position
	}
	return u.String()
}

// Flags adds the NATS client flags to fs and returns a function that
// builds the Auth once fs is parsed. The password is a secret
// (ResolveSecret): from --nats-password-file, else the file
// TICKETD_NATS_PASSWORD_FILE names, else PasswordEnv; never from a flag
// value. When no flag chooses the method (--nats-creds, --nats-nkey,
// --nats-user), TICKETD_NATS_CREDS, TICKETD_NATS_NKEY and
// TICKETD_NATS_USER may (as for serve). getenv is os.Getenv outside tests.
func Flags(fs *pflag.FlagSet, getenv func(string) string) func() (Auth, error) {
	creds := fs.String("nats-creds", "", "NATS credentials file (user JWT and seed) (or "+EnvName("nats-creds")+")")
	nkey := fs.String("nats-nkey", "", "NATS user nkey seed file (or "+EnvName("nats-nkey")+")")
	user := fs.String("nats-user", "", "NATS user name; the password comes from --nats-password-file, "+EnvName("nats-password-file")+" or "+PasswordEnv)
	pwFile := fs.String("nats-password-file", "", "file holding the NATS password (or "+EnvName("nats-password-file")+")")
	tokenFile := fs.String("nats-token-file", "", "file holding the NATS server's authorization token, instead of a user (or "+EnvName("nats-token-file")+", "+TokenEnv+")")
	ca := fs.String("nats-tls-ca", "", "CA certificates (PEM) that sign the NATS server's certificate; requires TLS")
	cert := fs.String("nats-tls-cert", "", "client certificate (PEM) for NATS servers that verify clients")
	key := fs.String("nats-tls-key", "", "client key (PEM) of --nats-tls-cert")
	inbox := fs.String("nats-inbox-prefix", "", "reply subject prefix instead of _INBOX (must match the user's subscribe permission)")
	return func() (Auth, error) {
		a := Auth{CredsFile: *creds, NKeyFile: *nkey, User: *user, TLSCA: *ca, TLSCert: *cert, TLSKey: *key, InboxPrefix: *inbox}
		if !fs.Changed("nats-creds") && !fs.Changed("nats-nkey") && !fs.Changed("nats-user") {
			a.CredsFile, a.NKeyFile, a.User = getenv(EnvName("nats-creds")), getenv(EnvName("nats-nkey")), getenv(EnvName("nats-user"))
		}
		if a.User != "" {
			pw, err := ResolveSecret("nats-password", *pwFile, getenv)
			if err != nil {
				return Auth{}, fmt.Errorf("%w: %w", ErrAuth, err)
			}
			a.Password = pw
		}
		// A token is the method when nothing else is chosen, or when its
		// file flag is given (Validate then refuses a second method).
		if fs.Changed("nats-token-file") || (a.CredsFile == "" && a.NKeyFile == "" && a.User == "") {
			tok, err := ResolveSecret("nats-token", *tokenFile, getenv)
			if err != nil {
				return Auth{}, fmt.Errorf("%w: %w", ErrAuth, err)
			}
			a.Token = tok
		}
		return a, a.Validate()
	}
}

// HasSecret reports whether any of urls (one URL or a comma-separated
// list) carries user info: a password (user:password@) or, since nats.go
// takes a bare user info as the server's token, a token (TOKEN@). Either
// is a secret that ps, shell history and configuration dumps would show.
func HasSecret(urls string) bool {
	for _, raw := range strings.Split(urls, ",") {
		raw = strings.TrimSpace(raw)
		// A host name has no '@': one that does not parse as user info
		// (no scheme, a stray '%') may still hold a secret before it.
		if u, err := url.Parse(raw); (err == nil && u.User != nil) || strings.Contains(raw, "@") {
			return true
		}
	}
	return false
}
