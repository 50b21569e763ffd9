package natsclient

import (
	"fmt"
	"strings"
)

// EnvName is the TICKETD_* environment variable of a setting:
// "control-credential" -> "TICKETD_CONTROL_CREDENTIAL".
func EnvName(key string) string {
	return "TICKETD_" + strings.ToUpper(strings.ReplaceAll(key, "-", "_"))
}

// ResolveSecret returns the secret called name ("nats-password",
// "control-credential", ...) the way every ticketd command reads it: from
// file (the command's --NAME-file flag; "" when not given), else from the
// file that TICKETD_NAME_FILE names, else from TICKETD_NAME; "" when none
// is set. A file and TICKETD_NAME that disagree are an error, as they are
// for serve. Secrets never come from a flag value: `ps` shows a command
// line to every local user. getenv is os.Getenv outside tests.
func ResolveSecret(name, file string, getenv func(string) string) (string, error) {
	if file == "" {
		file = getenv(EnvName(name) + "_FILE")
	}
	direct := getenv(EnvName(name))
	if file == "" {
		return direct, nil
	}
	v, err := ReadSecretFile(file)
	if err != nil {
		return "", fmt.Errorf("%s-file: %w", name, err)
	}
	if direct != "" && direct != v {
		return "", fmt.Errorf("%s is set both by %s and by a file, and they differ", name, EnvName(name))
	}
	return v, nil
}
