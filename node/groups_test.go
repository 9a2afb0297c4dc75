package node

import "testing"

// TestStoreOptionsSplitAmongGroups: a node's memtable, block cache and
// version cache are its budget, split among its groups' stores; one
// group's store takes them as given.
func TestStoreOptionsSplitAmongGroups(t *testing.T) {
	o := &Options{Groups: 1, MemTableSize: 64 << 20, CacheSize: 256 << 20, VersionCacheKeys: 1 << 18}
	if so := storeOptions(o, nil); so.MemTableSize != 64<<20 || so.CacheSize != 256<<20 || so.VersionCacheKeys != 1<<18 {
		t.Fatalf("one group: %+v", so)
	}
	o.Groups = 4
	if so := storeOptions(o, nil); so.MemTableSize != 16<<20 || so.CacheSize != 64<<20 || so.VersionCacheKeys != 1<<16 {
		t.Fatalf("four groups: %+v", so)
	}
	o.Groups, o.MemTableSize, o.VersionCacheKeys = 64, 32<<20, -1
	if so := storeOptions(o, nil); so.MemTableSize != 1<<20 || so.CacheSize != 4<<20 || so.VersionCacheKeys != -1 {
		t.Fatalf("64 groups (a floor of 1 MiB, no version cache kept none): %+v", so)
	}
}
