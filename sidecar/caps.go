package sidecar

import (
	"context"

	"github.com/cuesched/cuesched/publisher"
	"github.com/cuesched/cuesched/shared/replication"
)

// capCache is the cap mirror's memory: the caps last written to Redis,
// so a row whose caps did not change (a counter update) writes nothing.
type capCache struct {
	subCaps    map[[2]string][2]int64 // (show, alloc) -> size, burst
	folderCaps map[string][4]int64    // folder -> min, max cores, min, max gpus
	jobCaps    map[string][3]int64    // job -> max cores, max gpus, priority
}

func newCapCache() capCache {
	return capCache{subCaps: map[[2]string][2]int64{}, folderCaps: map[string][4]int64{}, jobCaps: map[string][3]int64{}}
}

func (c *consumer) planSub(p *plan, ch *replication.Change) {
	if ch.Op != replication.Insert && ch.Op != replication.Update {
		return
	}
	show, ok1 := col(ch.New, "pk_show")
	alloc, ok2 := col(ch.New, "pk_alloc")
	size, ok3 := colInt(ch.New, "int_size")
	burst, ok4 := colInt(ch.New, "int_burst")
	if !ok1 || !ok2 || !ok3 || !ok4 {
		c.badRow("subscription", ch, "pk_show, pk_alloc, int_size or int_burst")
		return
	}
	if !p.isManaged(c, show) {
		return
	}
	k, v := [2]string{show, alloc}, [2]int64{size, burst}
	if prev, seen := c.c.subCaps[k]; seen && prev == v {
		delete(p.subCaps, k) // a later row in this transaction put it back
		return
	}
	if p.subCaps == nil {
		p.subCaps = map[[2]string][2]int64{}
	}
	p.subCaps[k] = v
}

func (c *consumer) planFolder(ctx context.Context, p *plan, ch *replication.Change) error {
	if ch.Op != replication.Insert && ch.Op != replication.Update {
		return nil
	}
	folder, ok := col(ch.New, "pk_folder")
	var v [4]int64
	var oks [4]bool
	v[0], oks[0] = colInt(ch.New, "int_min_cores")
	v[1], oks[1] = colInt(ch.New, "int_max_cores")
	v[2], oks[2] = colInt(ch.New, "int_min_gpus")
	v[3], oks[3] = colInt(ch.New, "int_max_gpus")
	if !ok || !oks[0] || !oks[1] || !oks[2] || !oks[3] {
		c.badRow("folder_resource", ch, "pk_folder or a cap column")
		return nil
	}
	show, found, err := c.folderShow(ctx, folder)
	if err != nil || !found || !p.isManaged(c, show) {
		return err
	}
	if prev, seen := c.c.folderCaps[folder]; seen && prev == v {
		delete(p.foldCaps, folder)
		return nil
	}
	if p.foldCaps == nil {
		p.foldCaps, p.foldShow = map[string][4]int64{}, map[string]string{}
	}
	p.foldCaps[folder], p.foldShow[folder] = v, show
	return nil
}

func (c *consumer) planJobCaps(ctx context.Context, p *plan, ch *replication.Change) error {
	if ch.Op != replication.Insert && ch.Op != replication.Update {
		return nil
	}
	jobID, ok := col(ch.New, "pk_job")
	var v [3]int64
	var oks [3]bool
	v[0], oks[0] = colInt(ch.New, "int_max_cores")
	v[1], oks[1] = colInt(ch.New, "int_max_gpus")
	v[2], oks[2] = colInt(ch.New, "int_priority")
	if !ok || !oks[0] || !oks[1] || !oks[2] {
		c.badRow("job_resource", ch, "pk_job or a cap column")
		return nil
	}
	j, found, err := c.job(ctx, jobID)
	if err != nil || !found || !p.isManaged(c, j.show) {
		return err
	}
	if prev, seen := c.c.jobCaps[jobID]; seen && prev == v {
		delete(p.jobCaps, jobID)
		return nil
	}
	if p.jobCaps == nil {
		p.jobCaps = map[string][3]int64{}
	}
	p.jobCaps[jobID] = v
	return nil
}

func (c *consumer) writeCaps(ctx context.Context, txn *replication.Transaction, p *plan) error {
	// Stamped with the transaction's position: a limit reseed from an older
	// snapshot cannot put the old caps back (publisher.Limits.LSN).
	l := publisher.Limits{LSN: uint64(txn.EndLSN)}
	for k, v := range p.subCaps {
		l.Subs = append(l.Subs, publisher.SubLimits{ShowID: k[0], AllocID: k[1], Size: v[0], Burst: v[1]})
	}
	for f, v := range p.foldCaps {
		l.Folders = append(l.Folders, publisher.FolderLimits{FolderID: f, ShowID: p.foldShow[f], MinCores: v[0], MaxCores: v[1], MinGPUs: v[2], MaxGPUs: v[3]})
	}
	for j, v := range p.jobCaps {
		l.Jobs = append(l.Jobs, publisher.JobLimits{JobID: j, MaxCores: v[0], MaxGPUs: v[1], Priority: v[2]})
	}
	if l.Len() == 0 {
		return nil
	}
	if err := c.redisCall(ctx, "write caps", func(ctx context.Context) error {
		skipped, err := c.pub.WriteLimits(ctx, l, 0)
		if skipped > 0 {
			c.log.Debug("caps already written from a later position left alone", "end_lsn", txn.EndLSN, "hashes", skipped)
		}
		return err
	}); err != nil {
		return err
	}
	for k, v := range p.subCaps {
		c.c.subCaps[k] = v
	}
	for f, v := range p.foldCaps {
		c.c.folderCaps[f] = v
	}
	for j, v := range p.jobCaps {
		c.c.jobCaps[j] = v
	}
	c.m.capWrites.WithLabelValues("subscription").Add(float64(len(l.Subs)))
	c.m.capWrites.WithLabelValues("folder").Add(float64(len(l.Folders)))
	c.m.capWrites.WithLabelValues("job").Add(float64(len(l.Jobs)))
	c.log.Debug("cap changes written", "subscriptions", len(l.Subs), "folders", len(l.Folders), "jobs", len(l.Jobs))
	return nil
}
