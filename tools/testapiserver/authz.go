package main

// Authentication and RBAC for tests that need a server that enforces them
// (--authz-file). The file names bearer tokens (ServiceAccount-like
// identities, with their extra claims such as
// authentication.kubernetes.io/node-name) and the Roles, ClusterRoles and
// bindings a chart renders. Requests are authenticated with k8s.io/apiserver's
// own token authenticator, and authorized as kube-apiserver's RBAC authorizer
// does: system:masters is allowed everything; otherwise a request is allowed
// when a rule of a role bound to the user (a ClusterRoleBinding anywhere, a
// RoleBinding in its namespace) covers it. Whether a rule covers a request is
// decided by k8s.io/component-helpers' rbac validation.Covers, the rule
// comparison kube-apiserver uses against privilege escalation (the RBAC
// authorizer itself, plugin/pkg/auth/authorizer/rbac, is not packaged by
// Debian); a request is the one-verb, one-resource rule it asks for. Requests
// without a token are system:anonymous and may read only what upstream's
// system:public-info-viewer allows (/healthz, /livez, /readyz, /version).
//
// Every decision is appended to --audit-file as a JSON line (user, verb,
// resource, name, allowed, and the role and rule that allowed it), so tests
// can fail on any 403 and on any granted rule their component never used; so
// is every refusal at admission (admission.go), with its reason.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/component-helpers/auth/rbac/validation"
)

type identity struct {
	User   string              `json:"user"`
	Groups []string            `json:"groups"`
	Extra  map[string][]string `json:"extra"`
}

type authzFile struct {
	Tokens              map[string]identity         `json:"tokens"`
	ClusterRoles        []rbacv1.ClusterRole        `json:"clusterRoles"`
	Roles               []rbacv1.Role               `json:"roles"`
	ClusterRoleBindings []rbacv1.ClusterRoleBinding `json:"clusterRoleBindings"`
	RoleBindings        []rbacv1.RoleBinding        `json:"roleBindings"`
}

// publicInfo is what upstream's system:public-info-viewer grants everyone.
var publicInfo = []string{"/healthz", "/livez", "/readyz", "/version", "/version/"}

// isDiscovery: the paths of upstream's system:discovery ClusterRole (/api, /api/*, /apis, /apis/*,
// /openapi, /openapi/*).
func isDiscovery(path string) bool {
	for _, p := range []string{"/api", "/apis", "/openapi"} {
		if path == p || strings.HasPrefix(path, p+"/") {
			return true
		}
	}
	return false
}

func loadAuthz(path string) (*authzFile, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var f authzFile
	if err := json.Unmarshal(raw, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &f, nil
}

// tokenAuthenticator authenticates the file's bearer tokens; a request with
// no token is system:anonymous.
func tokenAuthenticator(f *authzFile) authenticator.Request {
	tokens := map[string]*user.DefaultInfo{}
	for tok, id := range f.Tokens {
		groups := append([]string{}, id.Groups...)
		groups = append(groups, user.AllAuthenticated)
		tokens[tok] = &user.DefaultInfo{Name: id.User, Groups: groups, Extra: id.Extra}
	}
	byToken := authenticatorfactory.NewFromTokens(tokens, nil)
	return authenticator.RequestFunc(func(r *http.Request) (*authenticator.Response, bool, error) {
		if strings.TrimSpace(r.Header.Get("Authorization")) == "" {
			return &authenticator.Response{User: &user.DefaultInfo{Name: user.Anonymous,
				Groups: []string{user.AllUnauthenticated}}}, true, nil
		}
		return byToken.AuthenticateRequest(r)
	})
}

type auditLine struct {
	User        string `json:"user"`
	Verb        string `json:"verb"`
	APIGroup    string `json:"apiGroup,omitempty"`
	Resource    string `json:"resource,omitempty"`
	Subresource string `json:"subresource,omitempty"`
	Namespace   string `json:"namespace,omitempty"`
	Name        string `json:"name,omitempty"`
	Path        string `json:"path"`
	Allowed     bool   `json:"allowed"`
	Role        string `json:"role,omitempty"`      // "ClusterRole/name" or "Role/ns/name"
	Rule        int    `json:"rule"`                // index of the rule in the role
	Admission   string `json:"admission,omitempty"` // refused at admission (admission.go), and why
}

type rbacAuthorizer struct {
	f     *authzFile
	mu    sync.Mutex
	audit *os.File
}

func newRBACAuthorizer(f *authzFile, auditPath string) (*rbacAuthorizer, error) {
	a := &rbacAuthorizer{f: f}
	if auditPath != "" {
		out, err := os.OpenFile(auditPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, err
		}
		a.audit = out
	}
	return a, nil
}

func subjectMatches(s rbacv1.Subject, u user.Info, bindingNS string) bool {
	switch s.Kind {
	case rbacv1.UserKind:
		return s.Name == u.GetName()
	case rbacv1.GroupKind:
		for _, g := range u.GetGroups() {
			if g == s.Name {
				return true
			}
		}
	case rbacv1.ServiceAccountKind:
		ns := s.Namespace
		if ns == "" {
			ns = bindingNS
		}
		return u.GetName() == "system:serviceaccount:"+ns+":"+s.Name
	}
	return false
}

// boundRoles returns (role label, rules) of every role bound to the user that
// applies in namespace ns ("" for cluster-scoped requests: ClusterRoleBindings only).
func (a *rbacAuthorizer) boundRoles(u user.Info, ns string) [](struct {
	label string
	rules []rbacv1.PolicyRule
}) {
	type bound = struct {
		label string
		rules []rbacv1.PolicyRule
	}
	clusterRole := func(name string) *rbacv1.ClusterRole {
		for i := range a.f.ClusterRoles {
			if a.f.ClusterRoles[i].Name == name {
				return &a.f.ClusterRoles[i]
			}
		}
		return nil
	}
	var out []bound
	for _, b := range a.f.ClusterRoleBindings {
		for _, s := range b.Subjects {
			if subjectMatches(s, u, "") {
				if cr := clusterRole(b.RoleRef.Name); cr != nil && b.RoleRef.Kind == "ClusterRole" {
					out = append(out, bound{"ClusterRole/" + cr.Name, cr.Rules})
				}
				break
			}
		}
	}
	if ns == "" {
		return out
	}
	for _, b := range a.f.RoleBindings {
		if b.Namespace != ns {
			continue
		}
		for _, s := range b.Subjects {
			if !subjectMatches(s, u, b.Namespace) {
				continue
			}
			if b.RoleRef.Kind == "ClusterRole" {
				if cr := clusterRole(b.RoleRef.Name); cr != nil {
					out = append(out, bound{"ClusterRole/" + cr.Name + "@" + ns, cr.Rules})
				}
			} else {
				for _, r := range a.f.Roles {
					if r.Namespace == ns && r.Name == b.RoleRef.Name {
						out = append(out, bound{"Role/" + ns + "/" + r.Name, r.Rules})
					}
				}
			}
			break
		}
	}
	return out
}

func (a *rbacAuthorizer) Authorize(_ context.Context, attrs authorizer.Attributes) (authorizer.Decision, string, error) {
	u := attrs.GetUser()
	line := auditLine{User: u.GetName(), Verb: attrs.GetVerb(), Path: attrs.GetPath(), Rule: -1}
	decide := func(ok bool, why string) (authorizer.Decision, string, error) {
		line.Allowed = ok
		a.write(line)
		if ok {
			return authorizer.DecisionAllow, why, nil
		}
		return authorizer.DecisionNoOpinion, why, nil
	}
	for _, g := range u.GetGroups() {
		if g == user.SystemPrivilegedGroup {
			return authorizer.DecisionAllow, "system:masters", nil // not audited: the tests' own set-up
		}
	}
	if !attrs.IsResourceRequest() {
		for _, p := range publicInfo {
			if attrs.GetPath() == p && attrs.GetVerb() == "get" {
				return authorizer.DecisionAllow, "public info", nil
			}
		}
	}
	if u.GetName() == user.Anonymous {
		return decide(false, "anonymous")
	}
	// API discovery, as upstream's system:discovery grants every authenticated user (not audited:
	// no chart grants it, so no least-privilege test weighs it)
	if !attrs.IsResourceRequest() && attrs.GetVerb() == "get" && isDiscovery(attrs.GetPath()) {
		return authorizer.DecisionAllow, "discovery", nil
	}
	want := rbacv1.PolicyRule{Verbs: []string{attrs.GetVerb()}}
	if attrs.IsResourceRequest() {
		line.APIGroup, line.Resource, line.Subresource = attrs.GetAPIGroup(), attrs.GetResource(), attrs.GetSubresource()
		line.Namespace, line.Name = attrs.GetNamespace(), attrs.GetName()
		res := attrs.GetResource()
		if attrs.GetSubresource() != "" {
			res += "/" + attrs.GetSubresource()
		}
		want.APIGroups, want.Resources = []string{attrs.GetAPIGroup()}, []string{res}
		if attrs.GetName() != "" {
			want.ResourceNames = []string{attrs.GetName()}
		}
	} else {
		want.NonResourceURLs = []string{attrs.GetPath()}
	}
	for _, b := range a.boundRoles(u, attrs.GetNamespace()) {
		for i, rule := range b.rules {
			// a resource rule never covers a non-resource request and the reverse (as RBAC's RuleAllows)
			if attrs.IsResourceRequest() != (len(rule.NonResourceURLs) == 0) {
				continue
			}
			if ok, _ := validation.Covers([]rbacv1.PolicyRule{rule}, []rbacv1.PolicyRule{want}); ok {
				line.Role, line.Rule = b.label, i
				return decide(true, fmt.Sprintf("%s rule %d", b.label, i))
			}
		}
	}
	return decide(false, "no RBAC rule allows it")
}

func (a *rbacAuthorizer) write(line auditLine) {
	if a.audit == nil {
		return
	}
	b, _ := json.Marshal(line)
	a.mu.Lock()
	defer a.mu.Unlock()
	_, _ = a.audit.Write(append(b, '\n'))
}

func randomToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
