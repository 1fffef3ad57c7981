package api

import (
	"fmt"
	"unicode/utf8"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// NotUTF8Field names the first string field of m, with its path as the
// API's errors name fields (spec.labels["k"], argv[1]), whose value or map
// key is not UTF-8, or returns "". Protobuf cannot encode such a string,
// and its marshaller's error names no field.
func NotUTF8Field(m protoreflect.Message) string {
	var found string
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		found = notUTF8Value(string(fd.Name()), fd, v)
		return found == ""
	})
	return found
}

func notUTF8Value(path string, fd protoreflect.FieldDescriptor, v protoreflect.Value) string {
	switch {
	case fd.IsList():
		l := v.List()
		for i := range l.Len() {
			if f := notUTF8Scalar(fmt.Sprintf("%s[%d]", path, i), fd, l.Get(i)); f != "" {
				return f
			}
		}
		return ""
	case fd.IsMap():
		found := ""
		v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
			key := k.Value()
			if fd.MapKey().Kind() == protoreflect.StringKind && !utf8.ValidString(key.String()) {
				found = path + " (a key)"
				return false
			}
			found = notUTF8Scalar(fmt.Sprintf("%s[%q]", path, key.String()), fd.MapValue(), mv)
			return found == ""
		})
		return found
	}
	return notUTF8Scalar(path, fd, v)
}

func notUTF8Scalar(path string, fd protoreflect.FieldDescriptor, v protoreflect.Value) string {
	switch fd.Kind() {
	case protoreflect.StringKind:
		if !utf8.ValidString(v.String()) {
			return path
		}
	case protoreflect.MessageKind, protoreflect.GroupKind:
		if f := NotUTF8Field(v.Message()); f != "" {
			return path + "." + f
		}
	}
	return ""
}
