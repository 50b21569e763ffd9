package protocol

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestDocumentedCodesMatch: the error table of docs/protocol.md §4 lists
// exactly the codes protocol.go defines, so neither can drift from the
// other.
func TestDocumentedCodesMatch(t *testing.T) {
	defined := definedCodes(t)
	doc, err := os.ReadFile("../../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	sec := string(doc)
	start := strings.Index(sec, "\n## 4. Errors")
	end := strings.Index(sec, "\n### 4.1")
	if start < 0 || end < start {
		t.Fatal("docs/protocol.md: section 4's error table not found")
	}
	var documented []string
	for _, m := range regexp.MustCompile("(?m)^\\| `([a-z_]+)` \\|").FindAllStringSubmatch(sec[start:end], -1) {
		documented = append(documented, m[1])
	}
	slices.Sort(documented)
	if !slices.Equal(documented, defined) {
		t.Fatalf("docs/protocol.md §4 lists %v\nprotocol.go defines %v", documented, defined)
	}
}

// definedCodes parses protocol.go for its Code constants.
func definedCodes(t *testing.T) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "protocol.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var codes []string
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok || vs.Type == nil || len(vs.Values) != 1 {
			return true
		}
		if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "Code" {
			return true
		}
		if lit, ok := vs.Values[0].(*ast.BasicLit); ok {
			s, err := strconv.Unquote(lit.Value)
			if err != nil {
				t.Fatal(err)
			}
			codes = append(codes, s)
		}
		return true
	})
	if len(codes) < 10 {
		t.Fatalf("found only %d codes in protocol.go", len(codes))
	}
	slices.Sort(codes)
	return codes
}

// TestDocumentedSubjects: docs/protocol.md §1 names every subject this
// package defines, so a client author meets none that the page does not
// explain.
func TestDocumentedSubjects(t *testing.T) {
	doc, err := os.ReadFile("../../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	sec := string(doc)
	start, end := strings.Index(sec, "\n## 1. Subjects"), strings.Index(sec, "\n## 2.")
	if start < 0 || end < start {
		t.Fatal("docs/protocol.md: section 1 not found")
	}
	sec = sec[start:end]
	for _, subject := range []string{
		SubjectAcquire, SubjectRelease, SubjectGet, SubjectRenew, SubjectList, SubjectWithdraw, SubjectStatus,
		SubjectWatchPrefix + ".k.<key>", SubjectWatchPrefix + ".h.<hash>", SubjectAuditPrefix + ".<type>",
		strings.Replace(NodeStatusSubject(7), "7", "<id>", 1),
		strings.Replace(ForwardSubject(7, "<op>"), "7", "<leader-id>", 1),
		SubjectPrefix + ".control.>",
		SubjectKeyedPrefix + ".<hash>.lock.<op>",
		strings.Replace(GroupSubject(7, "<op>"), "7", "<group>", 1),
		strings.Replace(GroupStatusSubject(7), "7", "<group>", 1),
		strings.NewReplacer("7", "<group>", "9", "<id>").Replace(Partition{Group: 7, Groups: 8}.NodeStatusSubject(9)),
		strings.NewReplacer("7", "<group>", "9", "<leader-id>").Replace(Partition{Group: 7, Groups: 8}.ForwardSubject(9, "<op>")),
	} {
		if !strings.Contains(sec, "`"+subject+"`") {
			t.Errorf("docs/protocol.md §1 does not name `%s`", subject)
		}
	}
}
