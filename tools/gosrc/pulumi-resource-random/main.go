// pulumi-resource-random: a small native re-implementation of the Pulumi Random provider.
//
// The real provider (github.com/pulumi/pulumi-random/provider/v4, a Terraform bridge over
// hashicorp/terraform-provider-random) is not served by the module proxy available to dualsched,
// and neither is a usable terraform-provider-random, so this implements the same resource types,
// tokens and property names as the pulumi-random Python SDK (4.21.x) expects:
//
//	random:index/randomBytes:RandomBytes     length, keepers -> base64, hex
//	random:index/randomId:RandomId           byteLength, prefix, keepers -> b64Std, b64Url, dec, hex
//	random:index/randomInteger:RandomInteger min, max, seed, keepers -> result
//	random:index/randomString:RandomString   length, upper/lower/numeric/special, min*, overrideSpecial -> result
//	random:index/randomPassword:RandomPassword  (as RandomString) -> result, bcryptHash
//	random:index/randomPet:RandomPet         length, prefix, separator, keepers -> id
//	random:index/randomShuffle:RandomShuffle inputs, resultCount, seed, keepers -> results
//	random:index/randomUuid:RandomUuid, randomUuid4:RandomUuid4, randomUuid7:RandomUuid7 -> result
//
// As in terraform-provider-random every input forces replacement; values are generated once at
// create time and then kept in state. Import (Read without state) is not supported.
package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash/crc64"
	"math/big"
	mrand "math/rand"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/crypto/bcrypt"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/pulumi/pulumi/sdk/v3/go/common/resource"
	"github.com/pulumi/pulumi/sdk/v3/go/common/resource/plugin"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi/provider"
	pulumirpc "github.com/pulumi/pulumi/sdk/v3/proto/go"
)

var version = "4.0.0-dev"

type propKind string

const (
	kInt    propKind = "integer"
	kStr    propKind = "string"
	kBool   propKind = "boolean"
	kMap    propKind = "map"
	kStrArr propKind = "array"
)

type prop struct {
	name     string
	kind     propKind
	required bool
	def      interface{} // default applied by Check
	secret   bool
}

type resType struct {
	token   string
	inputs  []prop
	outputs []prop // computed
	create  func(in resource.PropertyMap) (id string, out resource.PropertyMap, err error)
}

var keepers = prop{name: "keepers", kind: kMap}

var stringInputs = []prop{
	{name: "length", kind: kInt, required: true},
	{name: "upper", kind: kBool, def: true},
	{name: "lower", kind: kBool, def: true},
	{name: "numeric", kind: kBool, def: true},
	{name: "special", kind: kBool, def: true},
	{name: "minUpper", kind: kInt, def: 0},
	{name: "minLower", kind: kInt, def: 0},
	{name: "minNumeric", kind: kInt, def: 0},
	{name: "minSpecial", kind: kInt, def: 0},
	{name: "overrideSpecial", kind: kStr},
	keepers,
}

var types = map[string]*resType{}

func register(r *resType) { types[r.token] = r }

func init() {
	register(&resType{
		token:   "random:index/randomBytes:RandomBytes",
		inputs:  []prop{{name: "length", kind: kInt, required: true}, keepers},
		outputs: []prop{{name: "base64", kind: kStr, secret: true}, {name: "hex", kind: kStr, secret: true}},
		create: func(in resource.PropertyMap) (string, resource.PropertyMap, error) {
			n := intOf(in, "length")
			if n < 1 {
				return "", nil, fmt.Errorf("length must be at least 1")
			}
			b := randBytes(n)
			return "none", resource.PropertyMap{
				"base64": resource.NewStringProperty(base64.StdEncoding.EncodeToString(b)),
				"hex":    resource.NewStringProperty(hex.EncodeToString(b)),
			}, nil
		},
	})
	register(&resType{
		token:  "random:index/randomId:RandomId",
		inputs: []prop{{name: "byteLength", kind: kInt, required: true}, {name: "prefix", kind: kStr}, keepers},
		outputs: []prop{{name: "b64Std", kind: kStr}, {name: "b64Url", kind: kStr}, {name: "dec", kind: kStr},
			{name: "hex", kind: kStr}},
		create: func(in resource.PropertyMap) (string, resource.PropertyMap, error) {
			n := intOf(in, "byteLength")
			if n < 1 {
				return "", nil, fmt.Errorf("byteLength must be at least 1")
			}
			b := randBytes(n)
			prefix := strOf(in, "prefix")
			id := base64.RawURLEncoding.EncodeToString(b)
			return id, resource.PropertyMap{
				"b64Std": resource.NewStringProperty(prefix + base64.StdEncoding.EncodeToString(b)),
				"b64Url": resource.NewStringProperty(prefix + id),
				"dec":    resource.NewStringProperty(prefix + new(big.Int).SetBytes(b).String()),
				"hex":    resource.NewStringProperty(prefix + hex.EncodeToString(b)),
			}, nil
		},
	})
	register(&resType{
		token: "random:index/randomInteger:RandomInteger",
		inputs: []prop{{name: "min", kind: kInt, required: true}, {name: "max", kind: kInt, required: true},
			{name: "seed", kind: kStr}, keepers},
		outputs: []prop{{name: "result", kind: kInt}},
		create: func(in resource.PropertyMap) (string, resource.PropertyMap, error) {
			lo, hi := intOf(in, "min"), intOf(in, "max")
			if hi < lo {
				return "", nil, fmt.Errorf("minimum value needs to be smaller than or equal to maximum value")
			}
			r := seededRand(strOf(in, "seed"))
			v := lo + r.Intn(hi-lo+1)
			return strconv.Itoa(v), resource.PropertyMap{"result": resource.NewNumberProperty(float64(v))}, nil
		},
	})
	register(&resType{
		token:   "random:index/randomString:RandomString",
		inputs:  stringInputs,
		outputs: []prop{{name: "result", kind: kStr}},
		create: func(in resource.PropertyMap) (string, resource.PropertyMap, error) {
			s, err := genString(in)
			if err != nil {
				return "", nil, err
			}
			return s, resource.PropertyMap{"result": resource.NewStringProperty(s)}, nil
		},
	})
	register(&resType{
		token:   "random:index/randomPassword:RandomPassword",
		inputs:  stringInputs,
		outputs: []prop{{name: "result", kind: kStr, secret: true}, {name: "bcryptHash", kind: kStr, secret: true}},
		create: func(in resource.PropertyMap) (string, resource.PropertyMap, error) {
			s, err := genString(in)
			if err != nil {
				return "", nil, err
			}
			h, err := bcrypt.GenerateFromPassword([]byte(s), bcrypt.DefaultCost)
			if err != nil && len(s) > 72 { // bcrypt limit: hash the first 72 bytes like older x/crypto did
				h, err = bcrypt.GenerateFromPassword([]byte(s[:72]), bcrypt.DefaultCost)
			}
			if err != nil {
				return "", nil, err
			}
			return "none", resource.PropertyMap{
				"result":     resource.MakeSecret(resource.NewStringProperty(s)),
				"bcryptHash": resource.MakeSecret(resource.NewStringProperty(string(h))),
			}, nil
		},
	})
	register(&resType{
		token: "random:index/randomPet:RandomPet",
		inputs: []prop{{name: "length", kind: kInt, def: 2}, {name: "prefix", kind: kStr},
			{name: "separator", kind: kStr, def: "-"}, keepers},
		create: func(in resource.PropertyMap) (string, resource.PropertyMap, error) {
			n := intOf(in, "length")
			if n < 1 {
				return "", nil, fmt.Errorf("length must be at least 1")
			}
			sep := strOf(in, "separator")
			words := []string{}
			if p := strOf(in, "prefix"); p != "" {
				words = append(words, p)
			}
			for i := 0; i < n-2; i++ {
				words = append(words, pick(adverbs))
			}
			if n >= 2 {
				words = append(words, pick(adjectives))
			}
			words = append(words, pick(names))
			return strings.Join(words, sep), resource.PropertyMap{}, nil
		},
	})
	register(&resType{
		token: "random:index/randomShuffle:RandomShuffle",
		inputs: []prop{{name: "inputs", kind: kStrArr, required: true}, {name: "resultCount", kind: kInt},
			{name: "seed", kind: kStr}, keepers},
		outputs: []prop{{name: "results", kind: kStrArr}},
		create: func(in resource.PropertyMap) (string, resource.PropertyMap, error) {
			var items []resource.PropertyValue
			if v, ok := in["inputs"]; ok && v.IsArray() {
				items = v.ArrayValue()
			}
			count := len(items)
			if v, ok := in["resultCount"]; ok && v.IsNumber() {
				count = int(v.NumberValue())
			}
			results := []resource.PropertyValue{}
			if len(items) > 0 {
				r := seededRand(strOf(in, "seed"))
				perm := r.Perm(len(items))
				for i := 0; i < count; i++ {
					results = append(results, items[perm[i%len(items)]])
				}
			}
			return "-", resource.PropertyMap{"results": resource.NewArrayProperty(results)}, nil
		},
	})
	for _, tok := range []string{"random:index/randomUuid:RandomUuid", "random:index/randomUuid4:RandomUuid4",
		"random:index/randomUuid7:RandomUuid7"} {
		v7 := strings.HasSuffix(tok, "7")
		register(&resType{
			token:   tok,
			inputs:  []prop{keepers},
			outputs: []prop{{name: "result", kind: kStr}},
			create: func(in resource.PropertyMap) (string, resource.PropertyMap, error) {
				u := uuid(v7)
				return u, resource.PropertyMap{"result": resource.NewStringProperty(u)}, nil
			},
		})
	}
}

// ---------------------------------------------------------------- generators

func randBytes(n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return b
}

func randInt(n int) int {
	v, err := rand.Int(rand.Reader, big.NewInt(int64(n)))
	if err != nil {
		panic(err)
	}
	return int(v.Int64())
}

func pick(list []string) string { return list[randInt(len(list))] }

// seededRand mirrors terraform-provider-random: a seed string is hashed with CRC64 (ECMA);
// without a seed the generator is seeded from crypto/rand.
func seededRand(seed string) *mrand.Rand {
	var s int64
	if seed != "" {
		s = int64(crc64.Checksum([]byte(seed), crc64.MakeTable(crc64.ECMA)))
	} else {
		s = int64(binary.LittleEndian.Uint64(randBytes(8)))
	}
	return mrand.New(mrand.NewSource(s))
}

func genString(in resource.PropertyMap) (string, error) {
	const lower, upper, numeric = "abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789"
	special := "!@#$%&*()-_=+[]{}<>:?"
	if v, ok := in["overrideSpecial"]; ok && v.IsString() {
		special = v.StringValue()
	}
	length := intOf(in, "length")
	if length < 1 {
		return "", fmt.Errorf("length must be at least 1")
	}
	var chars string
	var result []byte
	add := func(enabled bool, set string, min int) {
		if enabled {
			chars += set
		}
		for i := 0; i < min && len(set) > 0; i++ {
			result = append(result, set[randInt(len(set))])
		}
	}
	add(boolOf(in, "upper"), upper, intOf(in, "minUpper"))
	add(boolOf(in, "lower"), lower, intOf(in, "minLower"))
	add(boolOf(in, "numeric"), numeric, intOf(in, "minNumeric"))
	add(boolOf(in, "special"), special, intOf(in, "minSpecial"))
	if chars == "" && len(result) < length {
		return "", fmt.Errorf("at least one of upper, lower, numeric or special must be true")
	}
	for len(result) < length {
		result = append(result, chars[randInt(len(chars))])
	}
	for i := len(result) - 1; i > 0; i-- { // Fisher-Yates with crypto/rand
		j := randInt(i + 1)
		result[i], result[j] = result[j], result[i]
	}
	return string(result), nil
}

func uuid(v7 bool) string {
	b := randBytes(16)
	if v7 {
		ms := uint64(time.Now().UnixMilli())
		b[0], b[1], b[2], b[3], b[4], b[5] = byte(ms>>40), byte(ms>>32), byte(ms>>24), byte(ms>>16), byte(ms>>8), byte(ms)
		b[6] = (b[6] & 0x0f) | 0x70
	} else {
		b[6] = (b[6] & 0x0f) | 0x40
	}
	b[8] = (b[8] & 0x3f) | 0x80
	h := hex.EncodeToString(b)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

var adverbs = []string{"actually", "amazingly", "briefly", "calmly", "certainly", "deeply", "eagerly", "early",
	"easily", "equally", "evenly", "fairly", "finally", "firmly", "freely", "fully", "gently", "gladly", "greatly",
	"happily", "highly", "hugely", "ideally", "jointly", "kindly", "largely", "lately", "likely", "loosely", "mainly",
	"merely", "mildly", "mostly", "namely", "nearly", "neatly", "newly", "nicely", "openly", "partly", "plainly",
	"quickly", "quietly", "rapidly", "rarely", "readily", "really", "safely", "sadly", "sharply", "simply", "slowly",
	"smoothly", "solely", "strongly", "surely", "truly", "vastly", "weekly", "wholly", "widely", "wildly"}

var adjectives = []string{"able", "active", "adapted", "alert", "amazed", "amused", "apt", "awake", "balanced",
	"big", "bold", "brave", "bright", "busy", "calm", "capital", "careful", "charmed", "cheerful", "clean", "clever",
	"close", "cool", "cosmic", "crack", "creative", "crisp", "current", "daring", "decent", "deep", "driven", "eager",
	"easy", "enabled", "epic", "equal", "exact", "fair", "famous", "fast", "fine", "firm", "fit", "fluent", "free",
	"fresh", "full", "funny", "game", "gentle", "giving", "glad", "golden", "good", "grand", "great", "happy", "hardy",
	"healthy", "helped", "heroic", "holy", "honest", "humble", "ideal", "immense", "inviting", "joint", "just",
	"keen", "kind", "large", "legal", "liberal", "live", "loved", "loyal", "lucky", "magical", "main", "major",
	"master", "merry", "mint", "modern", "moral", "natural", "neat", "new", "nice", "noble", "normal", "open",
	"optimal", "patient", "perfect", "pleasant", "polite", "popular", "precious", "present", "pretty", "prime",
	"proper", "proud", "quick", "quiet", "rapid", "rare", "ready", "real", "regular", "relaxed", "rich", "right",
	"robust", "romantic", "safe", "saving", "secure", "select", "sharp", "shining", "simple", "smart", "smooth",
	"solid", "sound", "special", "splendid", "stable", "steady", "still", "strong", "suited", "super", "sure",
	"sweet", "tender", "thankful", "tidy", "tight", "topical", "tough", "true", "trusted", "up", "usable", "valid",
	"vast", "verified", "vital", "warm", "welcome", "well", "whole", "wise", "witty", "worthy"}

var names = []string{"aardvark", "albatross", "alpaca", "ant", "antelope", "ape", "baboon", "badger", "bat",
	"bear", "beaver", "bee", "bison", "boa", "bobcat", "buck", "buffalo", "bug", "bull", "camel", "cat", "cattle",
	"chamois", "cheetah", "chicken", "chipmunk", "civet", "clam", "cobra", "cod", "colt", "condor", "coral", "cow",
	"coyote", "crab", "crane", "crow", "cub", "deer", "dingo", "dodo", "doe", "dog", "dolphin", "donkey", "dove",
	"dragon", "duck", "eagle", "eel", "egret", "elephant", "elk", "emu", "falcon", "ferret", "finch", "fish",
	"flamingo", "fly", "foal", "fox", "frog", "gannet", "gazelle", "gecko", "gibbon", "giraffe", "gnu", "goat",
	"goose", "gopher", "gorilla", "grouse", "gull", "hare", "hawk", "hen", "heron", "hippo", "hog", "horse",
	"hound", "ibex", "iguana", "impala", "jackal", "jaguar", "jay", "kangaroo", "kid", "kit", "kite", "kitten",
	"koala", "krill", "lamb", "lark", "lemur", "leopard", "lion", "lizard", "llama", "lobster", "locust", "lynx",
	"macaw", "mako", "mallard", "mammal", "manatee", "marlin", "marmot", "marten", "mayfly", "mink", "mole",
	"mollusk", "monkey", "moose", "moth", "mouse", "mule", "mustang", "newt", "octopus", "orca", "oriole", "osprey",
	"ostrich", "otter", "owl", "ox", "oyster", "panda", "panther", "parrot", "peacock", "pelican", "penguin",
	"pheasant", "pig", "pigeon", "piranha", "pony", "poodle", "porpoise", "possum", "puma", "pup", "python",
	"quail", "rabbit", "raccoon", "ram", "raven", "reindeer", "rhino", "robin", "rooster", "salmon", "seal",
	"shark", "sheep", "shrew", "skink", "skunk", "sloth", "snail", "snake", "sparrow", "spider", "squid",
	"squirrel", "stag", "starfish", "stork", "swan", "swift", "tahr", "tapir", "termite", "tiger", "toad",
	"tortoise", "toucan", "trout", "tuna", "turkey", "turtle", "unicorn", "viper", "vulture", "wallaby", "walrus",
	"warthog", "wasp", "weasel", "whale", "wolf", "wombat", "worm", "yak", "zebra"}

// ---------------------------------------------------------------- property helpers

func unwrap(v resource.PropertyValue) resource.PropertyValue {
	for v.IsSecret() {
		v = v.SecretValue().Element
	}
	return v
}

func intOf(m resource.PropertyMap, k string) int {
	if v, ok := m[resource.PropertyKey(k)]; ok {
		v = unwrap(v)
		if v.IsNumber() {
			return int(v.NumberValue())
		}
		if v.IsString() {
			n, _ := strconv.Atoi(v.StringValue())
			return n
		}
	}
	return 0
}

func strOf(m resource.PropertyMap, k string) string {
	if v, ok := m[resource.PropertyKey(k)]; ok {
		v = unwrap(v)
		if v.IsString() {
			return v.StringValue()
		}
	}
	return ""
}

func boolOf(m resource.PropertyMap, k string) bool {
	if v, ok := m[resource.PropertyKey(k)]; ok {
		v = unwrap(v)
		if v.IsBool() {
			return v.BoolValue()
		}
	}
	return false
}

var marshalOpts = plugin.MarshalOptions{KeepUnknowns: true, KeepSecrets: true, SkipNulls: true}

func unmarshal(s *structpb.Struct) (resource.PropertyMap, error) {
	if s == nil {
		return resource.PropertyMap{}, nil
	}
	return plugin.UnmarshalProperties(s, marshalOpts)
}

func marshal(m resource.PropertyMap) (*structpb.Struct, error) {
	return plugin.MarshalProperties(m, marshalOpts)
}

func typeOf(urn string) (*resType, error) {
	tok := urn
	if parts := strings.Split(urn, "::"); len(parts) >= 4 {
		tok = parts[2]
		if i := strings.LastIndex(tok, "$"); i >= 0 {
			tok = tok[i+1:]
		}
	}
	if t, ok := types[tok]; ok {
		return t, nil
	}
	return nil, fmt.Errorf("unknown resource type %q", tok)
}

// isEmpty treats null, missing and empty maps/arrays alike (keepers: {} == absent).
func isEmpty(v resource.PropertyValue, ok bool) bool {
	if !ok || v.IsNull() {
		return true
	}
	v = unwrap(v)
	return (v.IsObject() && len(v.ObjectValue()) == 0) || (v.IsArray() && len(v.ArrayValue()) == 0)
}

// ---------------------------------------------------------------- gRPC provider

type randomProvider struct {
	pulumirpc.UnimplementedResourceProviderServer
}

func (p *randomProvider) Handshake(ctx context.Context, req *pulumirpc.ProviderHandshakeRequest) (*pulumirpc.ProviderHandshakeResponse, error) {
	return &pulumirpc.ProviderHandshakeResponse{AcceptSecrets: true, AcceptResources: true}, nil
}

func (p *randomProvider) GetPluginInfo(context.Context, *emptypb.Empty) (*pulumirpc.PluginInfo, error) {
	return &pulumirpc.PluginInfo{Version: version}, nil
}

func (p *randomProvider) Attach(context.Context, *pulumirpc.PluginAttach) (*emptypb.Empty, error) {
	return &emptypb.Empty{}, nil
}

func (p *randomProvider) Cancel(context.Context, *emptypb.Empty) (*emptypb.Empty, error) {
	return &emptypb.Empty{}, nil
}

func (p *randomProvider) GetMapping(context.Context, *pulumirpc.GetMappingRequest) (*pulumirpc.GetMappingResponse, error) {
	return &pulumirpc.GetMappingResponse{}, nil
}

func (p *randomProvider) GetMappings(context.Context, *pulumirpc.GetMappingsRequest) (*pulumirpc.GetMappingsResponse, error) {
	return &pulumirpc.GetMappingsResponse{}, nil
}

func (p *randomProvider) CheckConfig(ctx context.Context, req *pulumirpc.CheckRequest) (*pulumirpc.CheckResponse, error) {
	return &pulumirpc.CheckResponse{Inputs: req.GetNews()}, nil
}

func (p *randomProvider) DiffConfig(ctx context.Context, req *pulumirpc.DiffRequest) (*pulumirpc.DiffResponse, error) {
	return &pulumirpc.DiffResponse{Changes: pulumirpc.DiffResponse_DIFF_NONE}, nil
}

func (p *randomProvider) Configure(ctx context.Context, req *pulumirpc.ConfigureRequest) (*pulumirpc.ConfigureResponse, error) {
	return &pulumirpc.ConfigureResponse{AcceptSecrets: true, SupportsPreview: true, AcceptResources: true}, nil
}

func (p *randomProvider) Check(ctx context.Context, req *pulumirpc.CheckRequest) (*pulumirpc.CheckResponse, error) {
	t, err := typeOf(req.GetUrn())
	if err != nil {
		return nil, err
	}
	news, err := unmarshal(req.GetNews())
	if err != nil {
		return nil, err
	}
	out := resource.PropertyMap{}
	var failures []*pulumirpc.CheckFailure
	for _, in := range t.inputs {
		k := resource.PropertyKey(in.name)
		v, ok := news[k]
		if !ok || v.IsNull() {
			if in.def != nil {
				out[k] = resource.NewPropertyValue(in.def)
			} else if in.required {
				failures = append(failures, &pulumirpc.CheckFailure{Property: in.name,
					Reason: fmt.Sprintf("Missing required property '%s'", in.name)})
			}
			continue
		}
		out[k] = v
	}
	for k := range news { // keep unknown extra keys out, but report them
		if _, known := out[k]; !known && !hasInput(t, string(k)) && !strings.HasPrefix(string(k), "__") {
			failures = append(failures, &pulumirpc.CheckFailure{Property: string(k),
				Reason: fmt.Sprintf("unknown property '%s' for %s", k, t.token)})
		}
	}
	s, err := marshal(out)
	if err != nil {
		return nil, err
	}
	return &pulumirpc.CheckResponse{Inputs: s, Failures: failures}, nil
}

func hasInput(t *resType, name string) bool {
	for _, in := range t.inputs {
		if in.name == name {
			return true
		}
	}
	return false
}

func (p *randomProvider) Diff(ctx context.Context, req *pulumirpc.DiffRequest) (*pulumirpc.DiffResponse, error) {
	t, err := typeOf(req.GetUrn())
	if err != nil {
		return nil, err
	}
	olds, err := unmarshal(req.GetOlds())
	if err != nil {
		return nil, err
	}
	news, err := unmarshal(req.GetNews())
	if err != nil {
		return nil, err
	}
	var replaces []string
	detailed := map[string]*pulumirpc.PropertyDiff{}
	for _, in := range t.inputs {
		k := resource.PropertyKey(in.name)
		ov, ook := olds[k]
		nv, nok := news[k]
		if isEmpty(ov, ook) && isEmpty(nv, nok) {
			continue
		}
		if ook && nok && (nv.ContainsUnknowns() || !unwrap(ov).DeepEquals(unwrap(nv))) || ook != nok {
			replaces = append(replaces, in.name)
			kind := pulumirpc.PropertyDiff_UPDATE_REPLACE
			if !ook {
				kind = pulumirpc.PropertyDiff_ADD_REPLACE
			} else if !nok {
				kind = pulumirpc.PropertyDiff_DELETE_REPLACE
			}
			detailed[in.name] = &pulumirpc.PropertyDiff{Kind: kind, InputDiff: true}
		}
	}
	if len(replaces) == 0 {
		return &pulumirpc.DiffResponse{Changes: pulumirpc.DiffResponse_DIFF_NONE, HasDetailedDiff: true}, nil
	}
	sort.Strings(replaces)
	return &pulumirpc.DiffResponse{Changes: pulumirpc.DiffResponse_DIFF_SOME, Replaces: replaces, Diffs: replaces,
		DetailedDiff: detailed, HasDetailedDiff: true}, nil
}

func (p *randomProvider) Create(ctx context.Context, req *pulumirpc.CreateRequest) (*pulumirpc.CreateResponse, error) {
	t, err := typeOf(req.GetUrn())
	if err != nil {
		return nil, err
	}
	in, err := unmarshal(req.GetProperties())
	if err != nil {
		return nil, err
	}
	out := in.Copy()
	if req.GetPreview() || in.ContainsUnknowns() {
		for _, o := range t.outputs {
			out[resource.PropertyKey(o.name)] = resource.MakeComputed(resource.NewStringProperty(""))
		}
		s, err := marshal(out)
		if err != nil {
			return nil, err
		}
		return &pulumirpc.CreateResponse{Properties: s}, nil
	}
	id, gen, err := t.create(in)
	if err != nil {
		return nil, err
	}
	for k, v := range gen {
		out[k] = v
	}
	s, err := marshal(out)
	if err != nil {
		return nil, err
	}
	return &pulumirpc.CreateResponse{Id: id, Properties: s}, nil
}

func (p *randomProvider) Read(ctx context.Context, req *pulumirpc.ReadRequest) (*pulumirpc.ReadResponse, error) {
	if req.GetProperties() == nil || len(req.GetProperties().GetFields()) == 0 {
		return nil, fmt.Errorf("import of %s is not supported by this provider build", req.GetUrn())
	}
	return &pulumirpc.ReadResponse{Id: req.GetId(), Properties: req.GetProperties(), Inputs: req.GetInputs()}, nil
}

func (p *randomProvider) Update(ctx context.Context, req *pulumirpc.UpdateRequest) (*pulumirpc.UpdateResponse, error) {
	olds, err := unmarshal(req.GetOlds())
	if err != nil {
		return nil, err
	}
	news, err := unmarshal(req.GetNews())
	if err != nil {
		return nil, err
	}
	for k, v := range news {
		olds[k] = v
	}
	s, err := marshal(olds)
	if err != nil {
		return nil, err
	}
	return &pulumirpc.UpdateResponse{Properties: s}, nil
}

func (p *randomProvider) Delete(ctx context.Context, req *pulumirpc.DeleteRequest) (*emptypb.Empty, error) {
	return &emptypb.Empty{}, nil
}

func (p *randomProvider) GetSchema(ctx context.Context, req *pulumirpc.GetSchemaRequest) (*pulumirpc.GetSchemaResponse, error) {
	b, err := json.Marshal(schema())
	if err != nil {
		return nil, err
	}
	return &pulumirpc.GetSchemaResponse{Schema: string(b)}, nil
}

func schemaType(pr prop) map[string]interface{} {
	switch pr.kind {
	case kMap:
		return map[string]interface{}{"type": "object", "additionalProperties": map[string]interface{}{"type": "string"}}
	case kStrArr:
		return map[string]interface{}{"type": "array", "items": map[string]interface{}{"type": "string"}}
	default:
		return map[string]interface{}{"type": string(pr.kind)}
	}
}

func schema() map[string]interface{} {
	resources := map[string]interface{}{}
	for tok, t := range types {
		inputs, props := map[string]interface{}{}, map[string]interface{}{}
		var reqIn, reqOut []string
		for _, in := range t.inputs {
			s := schemaType(in)
			s["willReplaceOnChanges"] = true
			inputs[in.name] = s
			props[in.name] = schemaType(in)
			if in.required {
				reqIn = append(reqIn, in.name)
			}
			if in.required || in.def != nil {
				reqOut = append(reqOut, in.name)
			}
		}
		for _, o := range t.outputs {
			s := schemaType(o)
			if o.secret {
				s["secret"] = true
			}
			props[o.name] = s
			reqOut = append(reqOut, o.name)
		}
		resources[tok] = map[string]interface{}{"inputProperties": inputs, "properties": props,
			"requiredInputs": reqIn, "required": reqOut}
	}
	return map[string]interface{}{"name": "random", "version": version, "displayName": "random",
		"description": "dualsched native re-implementation of the Pulumi Random provider",
		"resources":   resources, "language": map[string]interface{}{"python": map[string]interface{}{}}}
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "--version" {
		fmt.Println(version)
		return
	}
	if err := provider.Main("random", func(*provider.HostClient) (pulumirpc.ResourceProviderServer, error) {
		return &randomProvider{}, nil
	}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
