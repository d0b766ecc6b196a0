package main

import (
	"fmt"
	"sort"
	"strconv"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	resourcev1beta2 "k8s.io/api/resource/v1beta2"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/registry/generic"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"
	"k8s.io/apiserver/pkg/registry/rest"
)

// fieldGetter reads one selectable field (spec.nodeName, reason, ...) of an object.
type fieldGetter func(obj runtime.Object) string

// resource describes one served resource: its types, the field selectors it
// accepts, and the little of kube-apiserver's per-kind behaviour that this
// server reproduces.
type resource struct {
	gv         schema.GroupVersion
	plural     string
	singular   string
	namespaced bool
	shortNames []string
	newObj     func() runtime.Object
	newList    func() runtime.Object

	// fields are the selectable fields besides metadata.name/namespace.
	fields map[string]fieldGetter
	// status: the kind has a status subresource; updates of the main
	// resource keep .status and updates of /status keep .spec.
	status bool
	// createOnUpdate: a PUT of a missing object creates it (events, leases).
	createOnUpdate bool
	// generation: metadata.generation starts at 1 and moves on with each
	// change of .spec (pods and workloads).
	generation bool
	// onCreate resets or defaults what kube-apiserver resets or defaults
	// when the object is created.
	onCreate func(obj runtime.Object)
	// defaults applies kube-apiserver's defaults of the kind, on every
	// create and update.
	defaults func(obj runtime.Object)
	// gracefulDelete decides the grace period of a delete (pods only);
	// nil deletes at once.
	gracefulDelete func(obj runtime.Object, options *metav1.DeleteOptions) bool
	// returnDeleted: a DELETE answers with the deleted object, not a Status
	// (pods; the Python client expects a V1Pod back).
	returnDeleted bool
	// scale: the kind has a /scale subresource (spec.replicas, spec.selector,
	// status.replicas).
	scale bool
	// extra subresources keyed by name ("eviction", "binding").
	extra func(store *genericregistry.Store) map[string]rest.Storage
}

func (r *resource) groupResource() schema.GroupResource {
	return schema.GroupResource{Group: r.gv.Group, Resource: r.plural}
}

func (r *resource) kind() schema.GroupVersionKind {
	gvks, _, err := scheme.ObjectKinds(r.newObj())
	if err != nil {
		panic(err)
	}
	for _, gvk := range gvks {
		if gvk.GroupVersion() == r.gv {
			return gvk
		}
	}
	panic(fmt.Sprintf("no kind of version %s for resource %s", r.gv, r.plural))
}

// selectableFields lists every field label the resource accepts, sorted.
func (r *resource) selectableFields() []string {
	out := []string{"metadata.name"}
	if r.namespaced {
		out = append(out, "metadata.namespace")
	}
	for f := range r.fields {
		out = append(out, f)
	}
	sort.Strings(out)
	return out
}

// attrs returns the labels and selectable fields of an object.
func (r *resource) attrs(obj runtime.Object) (labels.Set, fields.Set, error) {
	m, err := meta.Accessor(obj)
	if err != nil {
		return nil, nil, err
	}
	fs := fields.Set{"metadata.name": m.GetName()}
	if r.namespaced {
		fs["metadata.namespace"] = m.GetNamespace()
	}
	for f, get := range r.fields {
		fs[f] = get(obj)
	}
	return labels.Set(m.GetLabels()), fs, nil
}

// newStore builds the etcd-backed generic store of the resource.
func (r *resource) newStore(optsGetter generic.RESTOptionsGetter) (*genericregistry.Store, error) {
	main := &strategy{ObjectTyper: scheme, res: r}
	store := &genericregistry.Store{
		NewFunc:                   r.newObj,
		NewListFunc:               r.newList,
		DefaultQualifiedResource:  r.groupResource(),
		SingularQualifiedResource: schema.GroupResource{Group: r.gv.Group, Resource: r.singular},
		CreateStrategy:            main,
		UpdateStrategy:            main,
		DeleteStrategy:            main,
		ResetFieldsStrategy:       main,
		TableConvertor:            rest.NewDefaultTableConvertor(r.groupResource()),
		ReturnDeletedObject:       r.returnDeleted,
	}
	err := store.CompleteWithOptions(&generic.StoreOptions{RESTOptions: optsGetter, AttrFunc: r.attrs})
	if err != nil {
		return nil, err
	}
	return store, nil
}

// restStorage returns the storage of the resource and its subresources,
// keyed as APIGroupInfo wants them ("pods", "pods/status", ...).
func (r *resource) restStorage(optsGetter generic.RESTOptionsGetter) (map[string]rest.Storage, error) {
	store, err := r.newStore(optsGetter)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", r.groupResource(), err)
	}
	out := map[string]rest.Storage{r.plural: &mainREST{Store: store, shortNames: r.shortNames}}
	if r.status {
		out[r.plural+"/status"] = newStatusREST(store, r)
	}
	if r.scale {
		out[r.plural+"/scale"] = &scaleREST{store: store}
	}
	if r.extra != nil {
		for name, s := range r.extra(store) {
			out[r.plural+"/"+name] = s
		}
	}
	return out, nil
}

// mainREST is the generic store plus the short names kubectl likes.
type mainREST struct {
	*genericregistry.Store
	shortNames []string
}

func (m *mainREST) ShortNames() []string { return m.shortNames }

// resources returns every resource this server serves, grouped by group version.
func resources() []*resource {
	return []*resource{
		{
			gv: corev1.SchemeGroupVersion, plural: "namespaces", singular: "namespace", shortNames: []string{"ns"},
			newObj: func() runtime.Object { return &corev1.Namespace{} }, newList: func() runtime.Object { return &corev1.NamespaceList{} },
			fields: map[string]fieldGetter{
				"status.phase": func(o runtime.Object) string { return string(o.(*corev1.Namespace).Status.Phase) },
			},
			status: true,
			onCreate: func(o runtime.Object) {
				o.(*corev1.Namespace).Status = corev1.NamespaceStatus{Phase: corev1.NamespaceActive}
			},
		},
		{
			gv: corev1.SchemeGroupVersion, plural: "nodes", singular: "node", shortNames: []string{"no"},
			newObj: func() runtime.Object { return &corev1.Node{} }, newList: func() runtime.Object { return &corev1.NodeList{} },
			fields: map[string]fieldGetter{
				"spec.unschedulable": func(o runtime.Object) string { return strconv.FormatBool(o.(*corev1.Node).Spec.Unschedulable) },
			},
			// A kubelet registers its Node with a status, so status is kept on create.
			status: true,
		},
		{
			gv: corev1.SchemeGroupVersion, plural: "pods", singular: "pod", namespaced: true, shortNames: []string{"po"},
			newObj: func() runtime.Object { return &corev1.Pod{} }, newList: func() runtime.Object { return &corev1.PodList{} },
			fields: podFields,
			status: true, generation: true,
			onCreate: func(o runtime.Object) {
				o.(*corev1.Pod).Status = corev1.PodStatus{Phase: corev1.PodPending}
			},
			gracefulDelete: podGracePeriod,
			returnDeleted:  true,
			extra: func(store *genericregistry.Store) map[string]rest.Storage {
				return map[string]rest.Storage{
					"eviction": &evictionREST{pods: store},
					"binding":  &bindingREST{pods: store},
				}
			},
		},
		{
			gv: corev1.SchemeGroupVersion, plural: "events", singular: "event", namespaced: true, shortNames: []string{"ev"},
			newObj: func() runtime.Object { return &corev1.Event{} }, newList: func() runtime.Object { return &corev1.EventList{} },
			fields:         eventFields,
			createOnUpdate: true,
		},
		{
			gv: corev1.SchemeGroupVersion, plural: "configmaps", singular: "configmap", namespaced: true, shortNames: []string{"cm"},
			newObj: func() runtime.Object { return &corev1.ConfigMap{} }, newList: func() runtime.Object { return &corev1.ConfigMapList{} },
		},
		{
			gv: coordinationv1.SchemeGroupVersion, plural: "leases", singular: "lease", namespaced: true,
			newObj: func() runtime.Object { return &coordinationv1.Lease{} }, newList: func() runtime.Object { return &coordinationv1.LeaseList{} },
			createOnUpdate: true,
		},
		{
			gv: appsv1.SchemeGroupVersion, plural: "deployments", singular: "deployment", namespaced: true, shortNames: []string{"deploy"},
			newObj: func() runtime.Object { return &appsv1.Deployment{} }, newList: func() runtime.Object { return &appsv1.DeploymentList{} },
			status: true, generation: true, scale: true, onCreate: resetStatusDefaultReplicas,
		},
		{
			gv: appsv1.SchemeGroupVersion, plural: "replicasets", singular: "replicaset", namespaced: true, shortNames: []string{"rs"},
			newObj: func() runtime.Object { return &appsv1.ReplicaSet{} }, newList: func() runtime.Object { return &appsv1.ReplicaSetList{} },
			fields: map[string]fieldGetter{
				"status.replicas": func(o runtime.Object) string { return strconv.Itoa(int(o.(*appsv1.ReplicaSet).Status.Replicas)) },
			},
			status: true, generation: true, scale: true, onCreate: resetStatusDefaultReplicas,
		},
		{
			gv: appsv1.SchemeGroupVersion, plural: "statefulsets", singular: "statefulset", namespaced: true, shortNames: []string{"sts"},
			newObj: func() runtime.Object { return &appsv1.StatefulSet{} }, newList: func() runtime.Object { return &appsv1.StatefulSetList{} },
			status: true, generation: true, scale: true, onCreate: resetStatusDefaultReplicas,
		},
		{
			gv: appsv1.SchemeGroupVersion, plural: "daemonsets", singular: "daemonset", namespaced: true, shortNames: []string{"ds"},
			newObj: func() runtime.Object { return &appsv1.DaemonSet{} }, newList: func() runtime.Object { return &appsv1.DaemonSetList{} },
			status: true, generation: true, onCreate: resetStatus,
		},
		{
			gv: batchv1.SchemeGroupVersion, plural: "jobs", singular: "job", namespaced: true,
			newObj: func() runtime.Object { return &batchv1.Job{} }, newList: func() runtime.Object { return &batchv1.JobList{} },
			fields: map[string]fieldGetter{
				"status.successful": func(o runtime.Object) string { return strconv.Itoa(int(o.(*batchv1.Job).Status.Succeeded)) },
			},
			status: true, generation: true, onCreate: resetStatus,
		},
		{
			gv: admissionregistrationv1.SchemeGroupVersion, plural: "validatingadmissionpolicies", singular: "validatingadmissionpolicy",
			newObj:  func() runtime.Object { return &admissionregistrationv1.ValidatingAdmissionPolicy{} },
			newList: func() runtime.Object { return &admissionregistrationv1.ValidatingAdmissionPolicyList{} },
			status:  true, generation: true, onCreate: resetStatus, defaults: defaultPolicy,
		},
		{
			gv: admissionregistrationv1.SchemeGroupVersion, plural: "validatingadmissionpolicybindings", singular: "validatingadmissionpolicybinding",
			newObj:     func() runtime.Object { return &admissionregistrationv1.ValidatingAdmissionPolicyBinding{} },
			newList:    func() runtime.Object { return &admissionregistrationv1.ValidatingAdmissionPolicyBindingList{} },
			generation: true, defaults: defaultBinding,
		},
		// Dynamic resource allocation. DeviceTaintRule is v1beta2: the
		// packaged k8s.io/api (0.36) has no v1 of it (scheme.go).
		{
			gv: resourcev1.SchemeGroupVersion, plural: "deviceclasses", singular: "deviceclass",
			newObj:     func() runtime.Object { return &resourcev1.DeviceClass{} },
			newList:    func() runtime.Object { return &resourcev1.DeviceClassList{} },
			generation: true,
		},
		{
			gv: resourcev1.SchemeGroupVersion, plural: "resourceslices", singular: "resourceslice",
			newObj:  func() runtime.Object { return &resourcev1.ResourceSlice{} },
			newList: func() runtime.Object { return &resourcev1.ResourceSliceList{} },
			// kube-apiserver's selectable fields of a slice (resourcev1.ResourceSliceSelector*)
			fields: map[string]fieldGetter{
				resourcev1.ResourceSliceSelectorNodeName: func(o runtime.Object) string {
					if n := o.(*resourcev1.ResourceSlice).Spec.NodeName; n != nil {
						return *n
					}
					return ""
				},
				resourcev1.ResourceSliceSelectorDriver: func(o runtime.Object) string { return o.(*resourcev1.ResourceSlice).Spec.Driver },
			},
			generation: true,
		},
		{
			gv: resourcev1.SchemeGroupVersion, plural: "resourceclaims", singular: "resourceclaim", namespaced: true,
			newObj:  func() runtime.Object { return &resourcev1.ResourceClaim{} },
			newList: func() runtime.Object { return &resourcev1.ResourceClaimList{} },
			status:  true, generation: true, onCreate: resetStatus,
		},
		{
			gv: resourcev1.SchemeGroupVersion, plural: "resourceclaimtemplates", singular: "resourceclaimtemplate", namespaced: true,
			newObj:     func() runtime.Object { return &resourcev1.ResourceClaimTemplate{} },
			newList:    func() runtime.Object { return &resourcev1.ResourceClaimTemplateList{} },
			generation: true,
		},
		{
			gv: resourcev1beta2.SchemeGroupVersion, plural: "devicetaintrules", singular: "devicetaintrule",
			newObj:  func() runtime.Object { return &resourcev1beta2.DeviceTaintRule{} },
			newList: func() runtime.Object { return &resourcev1beta2.DeviceTaintRuleList{} },
			status:  true, generation: true, onCreate: resetStatus,
		},
	}
}

var podFields = map[string]fieldGetter{
	"spec.nodeName":           func(o runtime.Object) string { return o.(*corev1.Pod).Spec.NodeName },
	"spec.restartPolicy":      func(o runtime.Object) string { return string(o.(*corev1.Pod).Spec.RestartPolicy) },
	"spec.schedulerName":      func(o runtime.Object) string { return o.(*corev1.Pod).Spec.SchedulerName },
	"spec.serviceAccountName": func(o runtime.Object) string { return o.(*corev1.Pod).Spec.ServiceAccountName },
	"spec.hostNetwork":        func(o runtime.Object) string { return strconv.FormatBool(o.(*corev1.Pod).Spec.HostNetwork) },
	"status.phase":            func(o runtime.Object) string { return string(o.(*corev1.Pod).Status.Phase) },
	"status.podIP":            func(o runtime.Object) string { return o.(*corev1.Pod).Status.PodIP },
	"status.nominatedNodeName": func(o runtime.Object) string {
		return o.(*corev1.Pod).Status.NominatedNodeName
	},
}

func event(o runtime.Object) *corev1.Event { return o.(*corev1.Event) }

var eventFields = map[string]fieldGetter{
	"involvedObject.kind":            func(o runtime.Object) string { return event(o).InvolvedObject.Kind },
	"involvedObject.namespace":       func(o runtime.Object) string { return event(o).InvolvedObject.Namespace },
	"involvedObject.name":            func(o runtime.Object) string { return event(o).InvolvedObject.Name },
	"involvedObject.uid":             func(o runtime.Object) string { return string(event(o).InvolvedObject.UID) },
	"involvedObject.apiVersion":      func(o runtime.Object) string { return event(o).InvolvedObject.APIVersion },
	"involvedObject.resourceVersion": func(o runtime.Object) string { return event(o).InvolvedObject.ResourceVersion },
	"involvedObject.fieldPath":       func(o runtime.Object) string { return event(o).InvolvedObject.FieldPath },
	"reason":                         func(o runtime.Object) string { return event(o).Reason },
	"reportingComponent":             func(o runtime.Object) string { return event(o).ReportingController },
	"source":                         func(o runtime.Object) string { return event(o).Source.Component },
	"type":                           func(o runtime.Object) string { return event(o).Type },
}

// podGracePeriod mirrors how kube-apiserver picks a pod's grace period: the
// request's, else the pod's terminationGracePeriodSeconds (not defaulted
// here: unset means 0); 0 for a pod that never reached a node or already
// finished. A positive period leaves the pod in place with a
// deletionTimestamp until someone (a test playing the kubelet) deletes it
// with a grace period of 0.
func podGracePeriod(obj runtime.Object, options *metav1.DeleteOptions) bool {
	if options == nil {
		return false
	}
	pod := obj.(*corev1.Pod)
	var period int64
	if options.GracePeriodSeconds != nil {
		period = *options.GracePeriodSeconds
	} else if pod.Spec.TerminationGracePeriodSeconds != nil {
		period = *pod.Spec.TerminationGracePeriodSeconds
	}
	if pod.Spec.NodeName == "" || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		period = 0
	}
	if period < 0 {
		period = 1
	}
	options.GracePeriodSeconds = &period
	return true
}
