package main

import (
	"fmt"
	"reflect"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	resourcev1 "k8s.io/api/resource/v1"
	resourcev1beta2 "k8s.io/api/resource/v1beta2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
)

// The group versions whose Go types this server knows. Scale and Eviction
// are only bodies of subresources; the rest are served as resources.
var knownGroupVersions = []schema.GroupVersion{
	corev1.SchemeGroupVersion,
	appsv1.SchemeGroupVersion,
	batchv1.SchemeGroupVersion,
	coordinationv1.SchemeGroupVersion,
	policyv1.SchemeGroupVersion,
	autoscalingv1.SchemeGroupVersion,
	admissionregistrationv1.SchemeGroupVersion,
	resourcev1.SchemeGroupVersion,
	resourcev1beta2.SchemeGroupVersion,
}

var addToSchemeFuncs = []func(*runtime.Scheme) error{
	corev1.AddToScheme,
	appsv1.AddToScheme,
	batchv1.AddToScheme,
	coordinationv1.AddToScheme,
	policyv1.AddToScheme,
	autoscalingv1.AddToScheme,
	admissionregistrationv1.AddToScheme,
	resourcev1.AddToScheme,
	addDeviceTaintRules,
}

// addDeviceTaintRules registers DeviceTaintRule, and nothing else, of
// resource.k8s.io/v1beta2. The packaged k8s.io/api (0.36) has it only in
// v1alpha3 and v1beta2, not yet in v1, while DeviceClass, ResourceSlice and
// ResourceClaim are served as v1: registering all of v1beta2 would give the
// group's hub version two Go types for one kind.
func addDeviceTaintRules(s *runtime.Scheme) error {
	gv := resourcev1beta2.SchemeGroupVersion
	s.AddKnownTypes(gv, &resourcev1beta2.DeviceTaintRule{}, &resourcev1beta2.DeviceTaintRuleList{})
	metav1.AddToGroupVersion(s, gv)
	return nil
}

var (
	// scheme is what the REST handlers and the storage codec work with.
	scheme         = runtime.NewScheme()
	codecs         = serializer.NewCodecFactory(scheme)
	parameterCodec = runtime.NewParameterCodec(scheme)

	// openAPIScheme holds the external kinds only; the OpenAPI definition
	// namer reads the group/version/kind extensions from it, so that no
	// "__internal" version leaks into the published specs.
	openAPIScheme = runtime.NewScheme()
)

func init() {
	for _, add := range addToSchemeFuncs {
		utilruntime.Must(add(scheme))
		utilruntime.Must(add(openAPIScheme))
	}
	// v1 is the group's preferred version; v1beta2 serves DeviceTaintRule only.
	for _, s := range []*runtime.Scheme{scheme, openAPIScheme} {
		utilruntime.Must(s.SetVersionPriority(resourcev1.SchemeGroupVersion, resourcev1beta2.SchemeGroupVersion))
	}
	registerHubVersions(scheme)
}

// registerHubVersions makes every API type of k8s.io/api also the type of its
// group's internal ("hub") version.
//
// The generic REST handlers decode request bodies into a group's internal
// version and the storage codec encodes from it. kube-apiserver has separate
// internal Go types for that; this server has only the versioned ones, and one
// version per group, so registering the same Go type under both versions turns
// every conversion between them into a change of the kind's label.
func registerHubVersions(s *runtime.Scheme) {
	for _, gv := range knownGroupVersions {
		hub := schema.GroupVersion{Group: gv.Group, Version: runtime.APIVersionInternal}
		for kind, t := range s.KnownTypes(gv) {
			// Skip the list/get/delete option types and WatchEvent that
			// metav1 registers in every group: the server decodes those
			// through its own parameter codec, and WatchEvent already has
			// an internal counterpart.
			if !strings.HasPrefix(t.PkgPath(), "k8s.io/api/") {
				continue
			}
			s.AddKnownTypeWithName(hub.WithKind(kind), reflect.New(t).Interface().(runtime.Object))
		}
	}
}

// registerFieldSelectors lets list and watch requests select on the given
// field labels of a kind; anything else is refused with a Bad Request, as
// kube-apiserver does.
func registerFieldSelectors(gvk schema.GroupVersionKind, labels []string) {
	allowed := make(map[string]bool, len(labels))
	for _, l := range labels {
		allowed[l] = true
	}
	utilruntime.Must(scheme.AddFieldLabelConversionFunc(gvk, func(label, value string) (string, string, error) {
		if allowed[label] {
			return label, value, nil
		}
		return "", "", fmt.Errorf("field label not supported: %s", label)
	}))
}
