package main

// Admission: kube-apiserver's own ValidatingAdmissionPolicy plugin
// (k8s.io/apiserver/pkg/admission/plugin/policy/validating), fed, as in
// kube-apiserver, by informers on the ValidatingAdmissionPolicies and their
// bindings this server serves (admissionregistration.k8s.io/v1). A policy
// created through the API is enforced about a second later (the plugin's
// refresh period), exactly as upstream.
//
// --objects FILE names ValidatingAdmissionPolicies and bindings (a JSON list:
// a chart's) created through the API before the server reports ready, the way
// an operator's `helm install` creates them before the components start; the
// server is ready only once the plugin has compiled them. The server also
// creates the namespaces kube-apiserver always has (default, kube-system, ...).

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/admission/initializer"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	"k8s.io/apiserver/pkg/endpoints/request"
	genericapiserver "k8s.io/apiserver/pkg/server"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"
)

// policyAdmission is the admission chain (the one plugin) and what starts it.
type policyAdmission struct {
	plugin    *validating.Plugin
	informers informers.SharedInformerFactory
	client    kubernetes.Interface
	dynamic   dynamic.Interface
	objects   []unstructured.Unstructured
}

// newPolicyAdmission builds the plugin as kube-apiserver's admission options
// do (options.AdmissionOptions.ApplyTo): clients of the server's own loopback
// connection, a shared informer factory, the server's authorizer (the CEL
// `authorizer` variable), its feature gates and version.
func newPolicyAdmission(cfg *genericapiserver.Config, objectsFile string) (*policyAdmission, error) {
	client, err := kubernetes.NewForConfig(cfg.LoopbackClientConfig)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg.LoopbackClientConfig)
	if err != nil {
		return nil, err
	}
	a := &policyAdmission{informers: informers.NewSharedInformerFactory(client, 0), client: client, dynamic: dyn}
	if objectsFile != "" {
		raw, err := os.ReadFile(objectsFile)
		if err != nil {
			return nil, err
		}
		if err := json.Unmarshal(raw, &a.objects); err != nil {
			return nil, fmt.Errorf("%s: %w", objectsFile, err)
		}
	}
	a.plugin, err = validating.NewPlugin(nil)
	if err != nil {
		return nil, err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(client.Discovery()))
	admission.PluginInitializers{
		initializer.NewAPIServerIDInitializer(cfg.APIServerID),
		initializer.New(client, dyn, a.informers, cfg.Authorization.Authorizer, utilfeature.DefaultFeatureGate,
			cfg.EffectiveVersion, cfg.DrainedNotify(), mapper),
	}.Initialize(a.plugin)
	if err := admission.ValidateInitialization(a.plugin); err != nil {
		return nil, err
	}
	cfg.AdmissionControl = a.plugin
	if rbac, ok := cfg.Authorization.Authorizer.(*rbacAuthorizer); ok && rbac.audit != nil {
		cfg.AdmissionControl = auditedAdmission{a.plugin, rbac}
	}
	return a, nil
}

// auditedAdmission appends each request the plugin refuses to --audit-file,
// beside the authorization decisions: a test that fails on any refused request
// then fails on a policy's refusal (422) as on RBAC's (403).
type auditedAdmission struct {
	*validating.Plugin
	rbac *rbacAuthorizer
}

func (a auditedAdmission) Validate(ctx context.Context, attr admission.Attributes, o admission.ObjectInterfaces) error {
	err := a.Plugin.Validate(ctx, attr, o)
	if err != nil {
		verb, path := strings.ToLower(string(attr.GetOperation())), ""
		if info, ok := request.RequestInfoFrom(ctx); ok {
			verb, path = info.Verb, info.Path // "patch", not the operation UPDATE
		}
		a.rbac.write(auditLine{User: attr.GetUserInfo().GetName(), Verb: verb, APIGroup: attr.GetResource().Group,
			Resource: attr.GetResource().Resource, Subresource: attr.GetSubresource(), Namespace: attr.GetNamespace(),
			Name: attr.GetName(), Path: path, Rule: -1, Admission: err.Error()})
	}
	return err
}

// systemNamespaces are the namespaces kube-apiserver creates at start. The
// plugin needs the namespace of a namespaced request (for the CEL
// namespaceObject) and refuses one that does not exist, as kube-apiserver's
// NamespaceLifecycle would; the kubelet's and gpuwarden's Node Events go to
// "default".
var systemNamespaces = []string{"default", "kube-system", "kube-public", "kube-node-lease"}

// start is the post-start hook. It creates the --objects, then starts the
// informers, so that their first list holds the objects; it returns once the
// plugin has compiled them (the server's /readyz waits for it), and then
// creates the system namespaces (requests other than to policies wait for the
// plugin to be ready).
func (a *policyAdmission) start(ctx genericapiserver.PostStartHookContext) error {
	if err := a.createObjects(ctx, a.objects); err != nil {
		return err
	}
	a.informers.Start(ctx.Done())
	// WaitForReady gives up after 10 s; a loaded machine may need longer
	ready := false
	for i := 0; i < 6 && !ready && ctx.Err() == nil; i++ {
		ready = a.plugin.WaitForReady()
	}
	if !ready {
		return fmt.Errorf("the ValidatingAdmissionPolicy plugin did not sync within a minute")
	}
	var namespaces []unstructured.Unstructured
	for _, ns := range systemNamespaces {
		namespaces = append(namespaces, unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns}}})
	}
	return a.createObjects(ctx, namespaces)
}

// createObjects creates each object through the API (an object that exists
// already is left as it is).
func (a *policyAdmission) createObjects(ctx context.Context, objects []unstructured.Unstructured) error {
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(a.client.Discovery()))
	for i := range objects {
		obj := &objects[i]
		var last error // the server may not serve discovery, or this kind, yet: retried until the deadline
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			gvk := obj.GroupVersionKind()
			m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
			if err != nil {
				last = err
				mapper.Reset()
				return false, nil
			}
			var r dynamic.ResourceInterface = a.dynamic.Resource(m.Resource)
			if m.Scope.Name() == meta.RESTScopeNameNamespace {
				r = a.dynamic.Resource(m.Resource).Namespace(obj.GetNamespace())
			}
			_, last = r.Create(ctx, obj, metav1.CreateOptions{})
			return last == nil || apierrors.IsAlreadyExists(last), nil
		})
		if err != nil {
			return fmt.Errorf("creating %s %s: %w (last error: %v)", obj.GetKind(), obj.GetName(), err, last)
		}
	}
	return nil
}

// defaultPolicy and defaultBinding apply the defaults kube-apiserver gives
// these kinds on every write (kubernetes' pkg/apis/admissionregistration/v1
// defaults, which no Debian package carries). They matter: the plugin reads an
// unset namespaceSelector as "matches nothing", so without them a policy
// would never see a namespaced resource.
func defaultPolicy(o runtime.Object) {
	spec := &o.(*admissionregistrationv1.ValidatingAdmissionPolicy).Spec
	if spec.FailurePolicy == nil {
		fail := admissionregistrationv1.Fail
		spec.FailurePolicy = &fail
	}
	if spec.MatchConstraints != nil {
		defaultMatchResources(spec.MatchConstraints)
	}
}

func defaultBinding(o runtime.Object) {
	spec := &o.(*admissionregistrationv1.ValidatingAdmissionPolicyBinding).Spec
	if spec.MatchResources != nil {
		defaultMatchResources(spec.MatchResources)
	}
	if spec.ParamRef != nil && spec.ParamRef.ParameterNotFoundAction == nil {
		deny := admissionregistrationv1.DenyAction
		spec.ParamRef.ParameterNotFoundAction = &deny
	}
}

func defaultMatchResources(m *admissionregistrationv1.MatchResources) {
	if m.MatchPolicy == nil {
		eq := admissionregistrationv1.Equivalent
		m.MatchPolicy = &eq
	}
	if m.NamespaceSelector == nil {
		m.NamespaceSelector = &metav1.LabelSelector{}
	}
	if m.ObjectSelector == nil {
		m.ObjectSelector = &metav1.LabelSelector{}
	}
	for _, rules := range [][]admissionregistrationv1.NamedRuleWithOperations{m.ResourceRules, m.ExcludeResourceRules} {
		for i := range rules {
			if rules[i].Scope == nil {
				all := admissionregistrationv1.AllScopes
				rules[i].Scope = &all
			}
		}
	}
}
