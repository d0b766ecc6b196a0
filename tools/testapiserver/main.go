// Command testapiserver is a small Kubernetes API server for gpuwarden's
// tests. It is built on k8s.io/apiserver, the library kube-apiserver itself
// is built on, and keeps its objects in a real etcd, so clients see the real
// REST semantics: resourceVersions and conflicts, watches, field and label
// selectors, strategic-merge, JSON-merge and JSON patches, server-side
// apply, status and scale subresources, graceful pod deletion.
//
// It is not kube-apiserver: no validation beyond object metadata, almost no
// defaulting, no controllers, no garbage collection. Tests play the kubelet,
// the scheduler and the controllers themselves. Its one admission plugin is
// kube-apiserver's ValidatingAdmissionPolicy (admission.go). Without
// --authz-file every request is served as a cluster admin; with it, bearer
// tokens are authenticated and RBAC is enforced (authz.go).
//
// It serves plain HTTP and is meant for loopback addresses only.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	openapinamer "k8s.io/apiserver/pkg/endpoints/openapi"
	"k8s.io/apiserver/pkg/registry/rest"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/server/options"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/apiserver/pkg/util/compatibility"
	restclient "k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"gpuwarden.test/testapiserver/openapi"
)

type flags struct {
	listen      string
	addressFile string
	etcdServers string
	etcdPrefix  string
	authzFile   string
	auditFile   string
	objectsFile string
}

func main() {
	klog.InitFlags(nil)
	var f flags
	flag.StringVar(&f.listen, "listen", "127.0.0.1:0", "host:port to serve plain HTTP on (port 0 picks a free one)")
	flag.StringVar(&f.addressFile, "address-file", "", "once serving, write the server's URL to this file (written atomically)")
	flag.StringVar(&f.etcdServers, "etcd-servers", "http://127.0.0.1:2379", "comma-separated etcd client URLs")
	flag.StringVar(&f.etcdPrefix, "etcd-prefix", "/registry", "key prefix of the objects in etcd")
	flag.StringVar(&f.authzFile, "authz-file", "", "JSON: bearer tokens and RBAC objects to enforce (authz.go); empty: everyone is a cluster admin")
	flag.StringVar(&f.auditFile, "audit-file", "", "with --authz-file: append every authorization decision here as a JSON line")
	flag.StringVar(&f.objectsFile, "objects", "", "JSON list of objects (ValidatingAdmissionPolicies and their bindings, say) to create through the API before the server is ready")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, f); err != nil {
		fmt.Fprintln(os.Stderr, "testapiserver:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, f flags) error {
	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return err
	}
	url := "http://" + ln.Addr().String()

	cfg, err := newConfig(ln.Addr().String(), url, f)
	if err != nil {
		return err
	}
	// built before Complete, which wraps the authorizer and loopback credentials it copies
	admission, err := newPolicyAdmission(cfg, f.objectsFile)
	if err != nil {
		return err
	}
	server, err := cfg.Complete(nil).New("gpuwarden-testapiserver", genericapiserver.NewEmptyDelegate())
	if err != nil {
		return err
	}
	if err := server.AddPostStartHook("gpuwarden-validating-admission-policy", admission.start); err != nil {
		return err
	}
	if err := installAPIs(server, cfg); err != nil {
		return err
	}

	prepared := server.PrepareRun()
	// With no secure serving configured this only runs the post-start
	// hooks; the HTTP server below does the serving.
	if _, _, err := prepared.NonBlockingRunWithContext(ctx, 0); err != nil {
		return err
	}
	httpServer := &http.Server{
		Handler:           trimTrailingSlash(server.Handler),
		ReadHeaderTimeout: 30 * time.Second,
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- httpServer.Serve(ln) }()

	if f.addressFile != "" {
		if err := writeAtomically(f.addressFile, url+"\n"); err != nil {
			return err
		}
	}
	klog.Infof("serving on %s", url)

	select {
	case <-ctx.Done():
	case err := <-serveErr:
		if !errors.Is(err, http.ErrServerClosed) {
			return err
		}
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = httpServer.Shutdown(shutdownCtx)
	server.Destroy()
	return nil
}

func newConfig(hostPort, url string, f flags) (*genericapiserver.Config, error) {
	cfg := genericapiserver.NewConfig(codecs)
	cfg.EffectiveVersion = compatibility.DefaultBuildEffectiveVersion()
	cfg.ExternalAddress = hostPort
	cfg.LoopbackClientConfig = &restclient.Config{Host: url}

	if f.authzFile != "" {
		authz, err := loadAuthz(f.authzFile)
		if err != nil {
			return nil, err
		}
		rbac, err := newRBACAuthorizer(authz, f.auditFile)
		if err != nil {
			return nil, err
		}
		cfg.Authentication.Authenticator = tokenAuthenticator(authz)
		cfg.Authorization.Authorizer = rbac
		// the server's own loopback client (post-start hooks) is privileged (config.go's Complete)
		cfg.LoopbackClientConfig.BearerToken = randomToken()
	} else {
		// Everyone is a cluster admin, and every request is allowed.
		cfg.Authentication.Authenticator = authenticator.RequestFunc(func(*http.Request) (*authenticator.Response, bool, error) {
			return &authenticator.Response{User: &user.DefaultInfo{
				Name:   "testapiserver-admin",
				Groups: []string{user.SystemPrivilegedGroup, user.AllAuthenticated},
			}}, true, nil
		})
		cfg.Authorization.Authorizer = authorizerfactory.NewAlwaysAllowAuthorizer()
	}

	// The OpenAPI definitions (generated by openapi-gen from k8s.io/api at
	// build time) give server-side apply its schema and are served at
	// /openapi/v2 and /openapi/v3.
	namer := openapinamer.NewDefinitionNamer(openAPIScheme)
	cfg.OpenAPIConfig = genericapiserver.DefaultOpenAPIConfig(openapi.GetOpenAPIDefinitions, namer)
	cfg.OpenAPIConfig.Info.Title = "gpuwarden test API server"
	cfg.OpenAPIV3Config = genericapiserver.DefaultOpenAPIV3Config(openapi.GetOpenAPIDefinitions, namer)
	cfg.OpenAPIV3Config.Info.Title = "gpuwarden test API server"

	served := servedGroupVersions()
	backend := storagebackend.NewDefaultConfig(f.etcdPrefix, codecs.LegacyCodec(served...))
	backend.Transport.ServerList = strings.Split(f.etcdServers, ",")
	backend.EncodeVersioner = schema.GroupVersions(served)
	etcd := options.NewEtcdOptions(backend)
	// No garbage collector runs here: orphan/foreground deletes must not
	// leave finalizers that nothing would ever remove.
	etcd.EnableGarbageCollection = false
	if errs := etcd.Validate(); len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if err := etcd.ApplyTo(cfg); err != nil {
		return nil, err
	}
	return cfg, nil
}

// servedGroupVersions are the group versions with resources of their own.
func servedGroupVersions() []schema.GroupVersion {
	seen := map[schema.GroupVersion]bool{}
	var out []schema.GroupVersion
	for _, r := range resources() {
		if !seen[r.gv] {
			seen[r.gv] = true
			out = append(out, r.gv)
		}
	}
	return out
}

// installAPIs registers every resource's storage and field selectors and
// installs the core group under /api and the others under /apis.
func installAPIs(server *genericapiserver.GenericAPIServer, cfg *genericapiserver.Config) error {
	byGV := map[schema.GroupVersion]map[string]rest.Storage{}
	for _, r := range resources() {
		registerFieldSelectors(r.kind(), r.selectableFields())
		storage, err := r.restStorage(cfg.RESTOptionsGetter)
		if err != nil {
			return err
		}
		if byGV[r.gv] == nil {
			byGV[r.gv] = map[string]rest.Storage{}
		}
		for path, s := range storage {
			byGV[r.gv][path] = s
		}
	}
	// One APIGroupInfo per group, holding all its served versions
	// (resource.k8s.io serves v1 and v1beta2).
	var groups []*genericapiserver.APIGroupInfo
	infos := map[string]*genericapiserver.APIGroupInfo{}
	for _, gv := range servedGroupVersions() {
		info := infos[gv.Group]
		if info == nil {
			i := genericapiserver.NewDefaultAPIGroupInfo(gv.Group, scheme, parameterCodec, codecs)
			info = &i
			infos[gv.Group] = info
			if gv.Group != "" {
				groups = append(groups, info)
			}
		}
		info.VersionedResourcesStorageMap[gv.Version] = byGV[gv]
	}
	if info := infos[""]; info != nil {
		if err := server.InstallLegacyAPIGroup(genericapiserver.DefaultLegacyAPIPrefix, info); err != nil {
			return fmt.Errorf("installing /api: %w", err)
		}
	}
	if err := server.InstallAPIGroups(groups...); err != nil {
		return fmt.Errorf("installing /apis: %w", err)
	}
	return nil
}

// trimTrailingSlash serves "/version/" as "/version": the go-restful that
// Debian packages answers 404 to paths with a trailing slash, which some
// clients send.
func trimTrailingSlash(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p := r.URL.Path; len(p) > 1 && strings.HasSuffix(p, "/") {
			r2 := r.Clone(r.Context())
			r2.URL.Path = strings.TrimRight(p, "/")
			if r2.URL.Path == "" {
				r2.URL.Path = "/"
			}
			r2.URL.RawPath = ""
			r = r2
		}
		h.ServeHTTP(w, r)
	})
}

func writeAtomically(path, content string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
