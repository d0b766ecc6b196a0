package main

import (
	"context"
	"fmt"
	"reflect"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"
	"k8s.io/apiserver/pkg/registry/rest"
	"k8s.io/apiserver/pkg/storage"
	storeerr "k8s.io/apiserver/pkg/storage/errors"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"
)

// ---- /status --------------------------------------------------------------

// statusREST serves <resource>/status: the same objects, through a copy of
// the main store whose update strategy keeps .spec.
type statusREST struct {
	store *genericregistry.Store
}

var (
	_ rest.Patcher             = (*statusREST)(nil)
	_ rest.ResetFieldsStrategy = (*statusREST)(nil)
	_ rest.TableConvertor      = (*statusREST)(nil)
)

func newStatusREST(main *genericregistry.Store, r *resource) *statusREST {
	copied := *main
	st := &strategy{ObjectTyper: scheme, res: r, forStatus: true}
	copied.UpdateStrategy = st
	copied.ResetFieldsStrategy = st
	return &statusREST{store: &copied}
}

func (s *statusREST) New() runtime.Object { return s.store.New() }

// Destroy does nothing: the main store owns the storage.
func (s *statusREST) Destroy() {}

func (s *statusREST) Get(ctx context.Context, name string, options *metav1.GetOptions) (runtime.Object, error) {
	return s.store.Get(ctx, name, options)
}

func (s *statusREST) Update(ctx context.Context, name string, objInfo rest.UpdatedObjectInfo, createValidation rest.ValidateObjectFunc, updateValidation rest.ValidateObjectUpdateFunc, forceAllowCreate bool, options *metav1.UpdateOptions) (runtime.Object, bool, error) {
	// A status update never creates the object.
	return s.store.Update(ctx, name, objInfo, createValidation, updateValidation, false, options)
}

func (s *statusREST) GetResetFields() map[fieldpath.APIVersion]*fieldpath.Set {
	return s.store.GetResetFields()
}

func (s *statusREST) ConvertToTable(ctx context.Context, object runtime.Object, tableOptions runtime.Object) (*metav1.Table, error) {
	return s.store.ConvertToTable(ctx, object, tableOptions)
}

// ---- /scale ---------------------------------------------------------------

// scaleREST serves <resource>/scale as autoscaling/v1 Scale for kinds with
// spec.replicas, spec.selector and status.replicas.
type scaleREST struct {
	store *genericregistry.Store
}

var (
	_ rest.Patcher                  = (*scaleREST)(nil)
	_ rest.GroupVersionKindProvider = (*scaleREST)(nil)
)

func (s *scaleREST) New() runtime.Object { return &autoscalingv1.Scale{} }

func (s *scaleREST) Destroy() {}

func (s *scaleREST) GroupVersionKind(schema.GroupVersion) schema.GroupVersionKind {
	return autoscalingv1.SchemeGroupVersion.WithKind("Scale")
}

func (s *scaleREST) Get(ctx context.Context, name string, options *metav1.GetOptions) (runtime.Object, error) {
	obj, err := s.store.Get(ctx, name, options)
	if err != nil {
		return nil, err
	}
	return scaleOf(obj)
}

func (s *scaleREST) Update(ctx context.Context, name string, objInfo rest.UpdatedObjectInfo, createValidation rest.ValidateObjectFunc, updateValidation rest.ValidateObjectUpdateFunc, forceAllowCreate bool, options *metav1.UpdateOptions) (runtime.Object, bool, error) {
	info := &scaleUpdate{inner: objInfo, validate: updateValidation, resource: s.store.DefaultQualifiedResource, name: name}
	obj, _, err := s.store.Update(ctx, name, info, rest.ValidateAllObjectFunc, rest.ValidateAllObjectUpdateFunc, false, options)
	if err != nil {
		return nil, false, err
	}
	sc, err := scaleOf(obj)
	return sc, false, err
}

// scaleOf builds the Scale view of a workload object.
func scaleOf(obj runtime.Object) (*autoscalingv1.Scale, error) {
	m, err := meta.Accessor(obj)
	if err != nil {
		return nil, err
	}
	spec, status := fieldOf(obj, "Spec"), fieldOf(obj, "Status")
	if !spec.IsValid() || !status.IsValid() {
		return nil, fmt.Errorf("%T has no spec/status", obj)
	}
	want := int32(1)
	if p, ok := spec.FieldByName("Replicas").Interface().(*int32); ok && p != nil {
		want = *p
	}
	var selector string
	if sel, ok := spec.FieldByName("Selector").Interface().(*metav1.LabelSelector); ok && sel != nil {
		ls, err := metav1.LabelSelectorAsSelector(sel)
		if err != nil {
			return nil, apierrors.NewInternalError(err)
		}
		selector = ls.String()
	}
	var have int32
	if v := status.FieldByName("Replicas"); v.IsValid() {
		have = int32(v.Int())
	}
	return &autoscalingv1.Scale{
		ObjectMeta: metav1.ObjectMeta{
			Name:              m.GetName(),
			Namespace:         m.GetNamespace(),
			UID:               m.GetUID(),
			ResourceVersion:   m.GetResourceVersion(),
			CreationTimestamp: m.GetCreationTimestamp(),
		},
		Spec:   autoscalingv1.ScaleSpec{Replicas: want},
		Status: autoscalingv1.ScaleStatus{Replicas: have, Selector: selector},
	}, nil
}

// scaleUpdate turns an update of a Scale into an update of the object behind it.
type scaleUpdate struct {
	inner    rest.UpdatedObjectInfo
	validate rest.ValidateObjectUpdateFunc
	resource schema.GroupResource
	name     string
}

func (u *scaleUpdate) Preconditions() *metav1.Preconditions { return u.inner.Preconditions() }

func (u *scaleUpdate) UpdatedObject(ctx context.Context, old runtime.Object) (runtime.Object, error) {
	oldScale, err := scaleOf(old)
	if err != nil {
		return nil, err
	}
	obj, err := u.inner.UpdatedObject(ctx, oldScale)
	if err != nil {
		return nil, err
	}
	newScale, ok := obj.(*autoscalingv1.Scale)
	if !ok {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("expected a Scale, got %T", obj))
	}
	if newScale.Spec.Replicas < 0 {
		return nil, apierrors.NewInvalid(autoscalingv1.SchemeGroupVersion.WithKind("Scale").GroupKind(), u.name, field.ErrorList{
			field.Invalid(field.NewPath("spec", "replicas"), newScale.Spec.Replicas, "must be greater than or equal to 0"),
		})
	}
	if rv := newScale.ResourceVersion; rv != "" && rv != oldScale.ResourceVersion {
		return nil, apierrors.NewConflict(u.resource, u.name,
			fmt.Errorf("the object has been modified; please apply your changes to the latest version and try again"))
	}
	if u.validate != nil {
		if err := u.validate(ctx, newScale, oldScale); err != nil {
			return nil, err
		}
	}
	out := old.DeepCopyObject()
	n := newScale.Spec.Replicas
	fieldOf(out, "Spec").FieldByName("Replicas").Set(reflect.ValueOf(&n))
	return out, nil
}

// ---- pods/eviction --------------------------------------------------------

// evictionREST serves pods/eviction: it deletes the pod with the eviction's
// delete options. No PodDisruptionBudget is consulted.
type evictionREST struct {
	pods *genericregistry.Store
}

var (
	_ rest.NamedCreater             = (*evictionREST)(nil)
	_ rest.GroupVersionKindProvider = (*evictionREST)(nil)
)

func (e *evictionREST) New() runtime.Object { return &policyv1.Eviction{} }

func (e *evictionREST) Destroy() {}

func (e *evictionREST) GroupVersionKind(schema.GroupVersion) schema.GroupVersionKind {
	return policyv1.SchemeGroupVersion.WithKind("Eviction")
}

func (e *evictionREST) Create(ctx context.Context, name string, obj runtime.Object, createValidation rest.ValidateObjectFunc, options *metav1.CreateOptions) (runtime.Object, error) {
	ev, ok := obj.(*policyv1.Eviction)
	if !ok {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("expected an Eviction, got %T", obj))
	}
	if ev.Name != "" && ev.Name != name {
		return nil, apierrors.NewBadRequest("name in URL does not match name in Eviction object")
	}
	if createValidation != nil {
		if err := createValidation(ctx, ev.DeepCopyObject()); err != nil {
			return nil, err
		}
	}
	del := &metav1.DeleteOptions{}
	if ev.DeleteOptions != nil {
		del = ev.DeleteOptions.DeepCopy()
	}
	if options != nil && len(options.DryRun) > 0 {
		del.DryRun = options.DryRun
	}
	if _, _, err := e.pods.Delete(ctx, name, rest.ValidateAllObjectFunc, del); err != nil {
		return nil, err
	}
	return &metav1.Status{Status: metav1.StatusSuccess}, nil
}

// ---- pods/binding ---------------------------------------------------------

// bindingREST serves pods/binding, the scheduler's way to put a pod on a
// node: it sets spec.nodeName and a PodScheduled=True condition, refusing a
// pod that is already bound or being deleted.
type bindingREST struct {
	pods *genericregistry.Store
}

var _ rest.NamedCreater = (*bindingREST)(nil)

func (b *bindingREST) New() runtime.Object { return &corev1.Binding{} }

func (b *bindingREST) Destroy() {}

func (b *bindingREST) Create(ctx context.Context, name string, obj runtime.Object, createValidation rest.ValidateObjectFunc, options *metav1.CreateOptions) (runtime.Object, error) {
	binding, ok := obj.(*corev1.Binding)
	if !ok {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("expected a Binding, got %T", obj))
	}
	if binding.Name != "" && binding.Name != name {
		return nil, apierrors.NewBadRequest("name in URL does not match name in Binding object")
	}
	if (binding.Target.Kind != "" && binding.Target.Kind != "Node") || binding.Target.Name == "" {
		return nil, apierrors.NewInvalid(corev1.SchemeGroupVersion.WithKind("Binding").GroupKind(), name, field.ErrorList{
			field.Invalid(field.NewPath("target"), binding.Target, "must name a Node"),
		})
	}
	if createValidation != nil {
		if err := createValidation(ctx, binding.DeepCopyObject()); err != nil {
			return nil, err
		}
	}
	key, err := b.pods.KeyFunc(ctx, name)
	if err != nil {
		return nil, err
	}
	node := binding.Target.Name
	dryRun := options != nil && len(options.DryRun) > 0
	bind := func(obj runtime.Object) (runtime.Object, error) {
		pod := obj.(*corev1.Pod)
		if pod.DeletionTimestamp != nil {
			return nil, apierrors.NewConflict(b.pods.DefaultQualifiedResource, name, fmt.Errorf("pod %s is being deleted, cannot be assigned to a host", name))
		}
		if pod.Spec.NodeName != "" {
			return nil, apierrors.NewConflict(b.pods.DefaultQualifiedResource, name, fmt.Errorf("pod %s is already assigned to node %q", name, pod.Spec.NodeName))
		}
		pod.Spec.NodeName = node
		setPodCondition(pod, corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()})
		return pod, nil
	}
	err = b.pods.Storage.GuaranteedUpdate(ctx, key, &corev1.Pod{}, false, nil, storage.SimpleUpdate(bind), dryRun, nil)
	if err != nil {
		return nil, storeerr.InterpretUpdateError(err, b.pods.DefaultQualifiedResource, name)
	}
	return &metav1.Status{Status: metav1.StatusSuccess}, nil
}

func setPodCondition(pod *corev1.Pod, c corev1.PodCondition) {
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == c.Type {
			pod.Status.Conditions[i] = c
			return
		}
	}
	pod.Status.Conditions = append(pod.Status.Conditions, c)
}
