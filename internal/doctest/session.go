package doctest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// StopTimeout bounds how long Close waits for the background processes to
// end after SIGTERM before it kills the whole process group.
const StopTimeout = 10 * time.Second

// Session is one bash process that runs steps in order, like a terminal.
type Session struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	replies chan string // lines bash writes on fd 3, one per finished step
	outDir  string      // each step's stdout and stderr: N.out, N.err
	log     *lockedBuffer
	n       int
	bg      []int // pids of the steps run in the background
	busy    bool  // a step outlived its deadline: bash reads nothing more
	closed  bool
}

// Result is what a finished step did.
type Result struct {
	Status         int
	Stdout, Stderr string
	// PID is the last process the step started in the background ($!),
	// 0 when none.
	PID int
	N   int // the step's number in the session, for Output
}

// Exit is a background process that ended before Close.
type Exit struct {
	PID, Status int
}

// Start runs bash in dir with env, in a process group of its own; outDir
// receives each step's output.
func Start(dir, outDir string, env []string) (*Session, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	log := &lockedBuffer{}
	cmd := exec.Command("bash", "--noprofile", "--norc")
	cmd.Dir, cmd.Env = dir, env
	cmd.Stdout, cmd.Stderr = log, log
	cmd.ExtraFiles = []*os.File{w} // fd 3
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		r.Close()
		w.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return nil, err
	}
	w.Close()
	s := &Session{cmd: cmd, stdin: stdin, replies: make(chan string, 16), outDir: outDir, log: log}
	go func() {
		defer close(s.replies)
		defer r.Close()
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			s.replies <- sc.Text()
		}
	}()
	return s, nil
}

// Run runs one step and waits for it (or, with background, for bash to
// have started it), at most until ctx ends.
func (s *Session) Run(ctx context.Context, text string, background bool) (Result, error) {
	s.n++
	n := s.n
	if background {
		text = StripComments(text) + " &"
	}
	out, errf := filepath.Join(s.outDir, fmt.Sprintf("%d.out", n)), filepath.Join(s.outDir, fmt.Sprintf("%d.err", n))
	// The step runs in the shell itself (a brace group, not a subshell),
	// so cd, variables and exports persist; fd 3 stays bash's own.
	script := fmt.Sprintf("{\n%s\n} 3>&- </dev/null >%s 2>%s\necho \"step %d $? $!\" >&3\n", text, shellQuote(out), shellQuote(errf), n)
	if _, err := io.WriteString(s.stdin, script); err != nil {
		return Result{}, fmt.Errorf("bash is gone: %w\n%s", err, s.log.String())
	}
	line, err := s.reply(ctx)
	if err != nil {
		s.busy = true
		return Result{N: n, Stdout: readFile(out), Stderr: readFile(errf)}, err
	}
	f := strings.Fields(line)
	if len(f) < 3 || f[0] != "step" || f[1] != strconv.Itoa(n) {
		return Result{}, fmt.Errorf("unexpected reply from bash %q", line)
	}
	res := Result{N: n}
	res.Status, _ = strconv.Atoi(f[2])
	if len(f) > 3 {
		res.PID, _ = strconv.Atoi(f[3])
	}
	if background && res.PID != 0 {
		s.bg = append(s.bg, res.PID)
	}
	res.Stdout, res.Stderr = readFile(out), readFile(errf)
	return res, nil
}

// Output is what step n has written so far, stdout then stderr.
func (s *Session) Output(n int) string {
	return readFile(filepath.Join(s.outDir, fmt.Sprintf("%d.out", n))) +
		readFile(filepath.Join(s.outDir, fmt.Sprintf("%d.err", n)))
}

// Steps is the number of steps run so far.
func (s *Session) Steps() int { return s.n }

// Log is what bash itself wrote (outside any step).
func (s *Session) Log() string { return s.log.String() }

func (s *Session) reply(ctx context.Context) (string, error) {
	select {
	case line, ok := <-s.replies:
		if !ok {
			return "", fmt.Errorf("bash exited\n%s", s.log.String())
		}
		return line, nil
	case <-ctx.Done():
		return "", fmt.Errorf("still running after the step's deadline: %w", ctx.Err())
	}
}

// Close ends the session: it reports the background processes that had
// already exited, sends SIGTERM to the others (and to every job of the
// shell) and waits for them, at most StopTimeout, then kills the whole
// process group and waits for bash. After a step outlived its deadline
// bash reads nothing more: the group is killed at once.
func (s *Session) Close() ([]Exit, error) {
	if s.closed {
		return nil, nil
	}
	s.closed = true
	var pids []string
	for _, p := range s.bg {
		pids = append(pids, strconv.Itoa(p))
	}
	script := fmt.Sprintf(`for p in %s; do
  if kill -0 "$p" 2>/dev/null; then kill -TERM "$p" 2>/dev/null; else wait "$p"; echo "exited $p $?" >&3; fi
done
kill -TERM $(jobs -p) 2>/dev/null
wait
echo closed >&3
exit 0
`, strings.Join(pids, " "))
	var exits []Exit
	var errs []error
	if s.busy {
		errs = append(errs, errors.New("a step was still running: every process killed"))
	} else if _, err := io.WriteString(s.stdin, script); err != nil {
		errs = append(errs, fmt.Errorf("bash is gone: %w", err))
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), StopTimeout)
	read:
		for {
			line, err := s.reply(ctx)
			if err != nil {
				errs = append(errs, fmt.Errorf("background processes did not stop on SIGTERM within %v: %w", StopTimeout, err))
				break
			}
			f := strings.Fields(line)
			switch {
			case len(f) == 1 && f[0] == "closed":
				break read
			case len(f) == 3 && f[0] == "exited":
				pid, _ := strconv.Atoi(f[1])
				status, _ := strconv.Atoi(f[2])
				exits = append(exits, Exit{PID: pid, Status: status})
			}
		}
		cancel()
	}
	_ = s.stdin.Close()
	// Whatever is left of the group (a process that ignored SIGTERM, or
	// one a job started) goes now.
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	_ = s.cmd.Wait()
	return exits, errors.Join(errs...)
}

// Alive reports whether process pid is running (not exited, not a zombie).
func Alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true // no /proc: kill(0) is all there is
	}
	// The state follows the command name in parentheses.
	if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) {
		return b[i+2] != 'Z'
	}
	return true
}

func readFile(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

// shellQuote quotes s for bash.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// lockedBuffer is a bytes.Buffer safe for the writes of exec's copying
// goroutines and reads of the test.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
