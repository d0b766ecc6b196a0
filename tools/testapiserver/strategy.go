package main

import (
	"context"
	"reflect"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/registry/rest"
	"k8s.io/apiserver/pkg/storage/names"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"
)

// strategy is the create/update/delete policy of one resource, or of its
// /status subresource when forStatus is set. It validates nothing: the
// generic store still checks object metadata (names, namespaces,
// resourceVersion preconditions), nothing else.
type strategy struct {
	runtime.ObjectTyper
	res       *resource
	forStatus bool
}

var (
	_ rest.RESTCreateStrategy         = (*strategy)(nil)
	_ rest.RESTUpdateStrategy         = (*strategy)(nil)
	_ rest.RESTGracefulDeleteStrategy = (*strategy)(nil)
	_ rest.ResetFieldsStrategy        = (*strategy)(nil)
)

func (s *strategy) GenerateName(base string) string {
	return names.SimpleNameGenerator.GenerateName(base)
}

func (s *strategy) NamespaceScoped() bool { return s.res.namespaced }

func (s *strategy) PrepareForCreate(ctx context.Context, obj runtime.Object) {
	if s.res.generation {
		setGeneration(obj, 1)
	}
	if s.res.onCreate != nil {
		s.res.onCreate(obj)
	}
	if s.res.defaults != nil {
		s.res.defaults(obj)
	}
}

// PrepareForUpdate keeps what the request may not change: .spec on a
// /status update, .status on a main update. metadata.generation moves
// on when, and only when, .spec changes.
func (s *strategy) PrepareForUpdate(ctx context.Context, obj, old runtime.Object) {
	oldGen := generation(old)
	if s.forStatus {
		copyField(obj, old, "Spec")
		setGeneration(obj, oldGen)
		return
	}
	if s.res.status {
		copyField(obj, old, "Status")
	}
	if s.res.defaults != nil {
		s.res.defaults(obj)
	}
	if !s.res.generation {
		setGeneration(obj, oldGen)
		return
	}
	if apiequality.Semantic.DeepEqual(fieldOf(obj, "Spec").Interface(), fieldOf(old, "Spec").Interface()) {
		setGeneration(obj, oldGen)
	} else {
		setGeneration(obj, oldGen+1)
	}
}

func (s *strategy) Validate(ctx context.Context, obj runtime.Object) field.ErrorList { return nil }

func (s *strategy) WarningsOnCreate(ctx context.Context, obj runtime.Object) []string { return nil }

func (s *strategy) Canonicalize(obj runtime.Object) {}

func (s *strategy) AllowCreateOnUpdate() bool { return s.res.createOnUpdate && !s.forStatus }

func (s *strategy) ValidateUpdate(ctx context.Context, obj, old runtime.Object) field.ErrorList {
	return nil
}

func (s *strategy) WarningsOnUpdate(ctx context.Context, obj, old runtime.Object) []string {
	return nil
}

func (s *strategy) AllowUnconditionalUpdate() bool { return true }

// GetResetFields tells server-side apply which fields a request through
// this endpoint never owns.
func (s *strategy) GetResetFields() map[fieldpath.APIVersion]*fieldpath.Set {
	if !s.res.status {
		return nil
	}
	reset := "status"
	if s.forStatus {
		reset = "spec"
	}
	return map[fieldpath.APIVersion]*fieldpath.Set{
		fieldpath.APIVersion(s.res.gv.String()): fieldpath.NewSet(fieldpath.MakePathOrDie(reset)),
	}
}

// CheckGracefulDelete makes the store set a deletionTimestamp instead of
// deleting when the resource's policy asks for a grace period.
func (s *strategy) CheckGracefulDelete(ctx context.Context, obj runtime.Object, options *metav1.DeleteOptions) bool {
	if s.res.gracefulDelete == nil {
		return false
	}
	return s.res.gracefulDelete(obj, options)
}

// The helpers below use reflection so that one strategy serves every kind:
// all workload kinds name their halves Spec and Status.

func fieldOf(obj runtime.Object, name string) reflect.Value {
	v := reflect.ValueOf(obj)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		return reflect.Value{}
	}
	return v.Elem().FieldByName(name)
}

func copyField(dst, src runtime.Object, name string) {
	d, s := fieldOf(dst, name), fieldOf(src, name)
	if d.IsValid() && s.IsValid() && d.CanSet() {
		d.Set(s)
	}
}

func generation(obj runtime.Object) int64 {
	m, err := meta.Accessor(obj)
	if err != nil {
		return 0
	}
	return m.GetGeneration()
}

func setGeneration(obj runtime.Object, g int64) {
	if m, err := meta.Accessor(obj); err == nil {
		m.SetGeneration(g)
	}
}

// resetStatus drops the status a client sent with a create, as
// kube-apiserver does for kinds with a status subresource.
func resetStatus(obj runtime.Object) {
	st := fieldOf(obj, "Status")
	if st.IsValid() && st.CanSet() {
		st.Set(reflect.Zero(st.Type()))
	}
}

// resetStatusDefaultReplicas also defaults spec.replicas to 1, the one
// default of kube-apiserver this server applies (the scale subresource and
// controllers-played-by-tests read it).
func resetStatusDefaultReplicas(obj runtime.Object) {
	resetStatus(obj)
	spec := fieldOf(obj, "Spec")
	if !spec.IsValid() {
		return
	}
	r := spec.FieldByName("Replicas")
	if r.IsValid() && r.Kind() == reflect.Pointer && r.IsNil() {
		one := int32(1)
		r.Set(reflect.ValueOf(&one))
	}
}
