package main

import (
	"fmt"
	"os"

	"github.com/spf13/pflag"

	"github.com/ticketd/ticketd/internal/natsclient"
)

// Secrets never come from a flag value: `ps` shows a command line to every
// local user. Each secret has a --NAME-file flag and two variables,
// TICKETD_NAME_FILE (a file) and TICKETD_NAME (the value), read the same
// way by every command that takes the flag (natsclient.ResolveSecret;
// serve reads them through its configuration). The README's secrets table
// lists them.

// secretFlag is one secret's --NAME-file flag on a command.
type secretFlag struct {
	name string // "control-credential"
	file string
}

// addSecretFlag adds --NAME-file to fs; what says what the secret is.
func addSecretFlag(fs *pflag.FlagSet, name, what string) *secretFlag {
	s := &secretFlag{name: name}
	env := natsclient.EnvName(name)
	fs.StringVar(&s.file, name+"-file", "", fmt.Sprintf("file holding the %s (or %s_FILE, %s)", what, env, env))
	return s
}

// value is the secret: from the flag's file, else TICKETD_NAME_FILE's,
// else TICKETD_NAME; "" when none is set.
func (s *secretFlag) value() (string, error) {
	return natsclient.ResolveSecret(s.name, s.file, os.Getenv)
}

// refusedSecretFlag says where the secret of a refused flag goes instead:
// flags that took a secret as their value (some once did) and would put it
// on the command line. "" for any other flag.
func refusedSecretFlag(flag string) string {
	name := flag
	switch flag {
	case "peer-secret", "control-credential", "bootstrap-credential", "join-credential", "nats-password", "nats-token":
	case "credential":
		name = "control-credential" // the old name on admin and snapshot save
	case "password":
		name = "nats-password"
	default:
		return ""
	}
	env := natsclient.EnvName(name)
	return fmt.Sprintf("--%s is refused: a secret on the command line is visible to every local user (ps); use --%s-file FILE, or %s_FILE or %s in the environment",
		flag, name, env, env)
}

// natsURLPasswordRefusal refuses a NATS URL (of --flag) that carries a
// password or a token.
func natsURLPasswordRefusal(flag string) *refusal {
	return &refusal{fmt.Sprintf("--%s carries a password or token (user:password@ or token@), which ps and logs would show: give the user with --nats-user and the password with --nats-password-file FILE, %s_FILE or %s; a token with --nats-token-file FILE, %s_FILE or %s",
		flag, natsclient.PasswordEnv, natsclient.PasswordEnv, natsclient.TokenEnv, natsclient.TokenEnv)}
}
