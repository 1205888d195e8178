/* SPDX-License-Identifier: BSD-3-Clause */
#include "log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static int log_level = MP_LOG_WARN;

static FILE *log_file;
static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static _Thread_local int log_rank = -1;
/* This thread's last WARN message, without its prefix (mp_log_last_warn). */
static _Thread_local char last_warn[512];
static char log_host[64];
static int log_stamp;

static int parse_level(const char *s)
{
	if (!s)
		return -1;
	if (!strcasecmp(s, "NONE") || !strcasecmp(s, "0"))
		return MP_LOG_NONE;
	if (!strcasecmp(s, "WARN") || !strcasecmp(s, "1"))
		return MP_LOG_WARN;
	if (!strcasecmp(s, "INFO") || !strcasecmp(s, "2"))
		return MP_LOG_INFO;
	if (!strcasecmp(s, "TRACE") || !strcasecmp(s, "3"))
		return MP_LOG_TRACE;
	return -1;
}

static void log_setup(void)
{
	const char *lvl = getenv("MP_DEBUG");
	int l = parse_level(lvl);

	if (l >= 0)
		log_level = l;
	else if (lvl && *lvl)
		fprintf(stderr, "[moshpit] WARN MP_DEBUG=%s not understood (NONE, WARN, INFO, TRACE)\n", lvl);

	/* Wall-clock stamps let lines from many processes be put in order. */
	const char *ts = getenv("MP_DEBUG_TIMESTAMP");
	log_stamp = ts && *ts && strcmp(ts, "0");

	/* MP_DEBUG_FILE=path.%h.%p, as NCCL_DEBUG_FILE: %h host, %p pid. */
	gethostname(log_host, sizeof(log_host) - 1);
	const char *f = getenv("MP_DEBUG_FILE");
	if (f && *f) {
		char path[512], pid[16];
		size_t o = 0;
		int fits = 1;

		snprintf(pid, sizeof(pid), "%d", (int)getpid());
		/* Expanded in full or not at all: a path cut short would send
		 * the lines to a file nobody asked for. */
		for (const char *p = f; *p && fits; p++) {
			const char *add = p;
			size_t n = 1;

			if (p[0] == '%' && (p[1] == 'h' || p[1] == 'p')) {
				add = p[1] == 'h' ? log_host : pid;
				n = strlen(add);
				p++;
			}
			if (n >= sizeof(path) - o) {
				fits = 0;
				break;
			}
			memcpy(path + o, add, n);
			o += n;
		}
		path[o] = '\0';
		if (!fits)
			fprintf(stderr, "[moshpit] WARN MP_DEBUG_FILE=%s: the expanded path is longer "
				"than %zu bytes; logging to stderr\n", f, sizeof(path) - 1);
		else if ((log_file = fopen(path, "a")))
			setvbuf(log_file, NULL, _IOLBF, 0);
	}
}

void mp_log_init(void)
{
	pthread_once(&log_once, log_setup);
}

void mp_log_set_level(int level)
{
	mp_log_init();
	if (level >= MP_LOG_NONE && level <= MP_LOG_TRACE)
		log_level = level;
}

int mp_log_get_level(void)
{
	mp_log_init();
	return log_level;
}

void mp_log_set_rank(int rank)
{
	log_rank = rank;
}

void mp_log(int level, const char *file, int line, const char *fmt, ...)
{
	static const char *names[] = {"NONE", "WARN", "INFO", "TRACE"};
	char msg[1024];
	va_list ap;
	FILE *out;
	int n;

	/* Drivers out of the tree call this too: a level out of range is named, not indexed. */
	if (level < MP_LOG_WARN)
		level = MP_LOG_WARN;
	else if (level > MP_LOG_TRACE)
		level = MP_LOG_TRACE;
	if (!file)
		file = "?";
	mp_log_init();
	out = log_file ? log_file : stderr;
	n = 0;
	if (log_stamp) {
		struct timespec t;
		struct tm tm;
		clock_gettime(CLOCK_REALTIME, &t);
		localtime_r(&t.tv_sec, &tm);
		n = snprintf(msg, sizeof(msg), "%02d:%02d:%02d.%03ld ", tm.tm_hour, tm.tm_min,
			     tm.tm_sec, t.tv_nsec / 1000000);
	}
	n += snprintf(msg + n, sizeof(msg) - (size_t)n, "%s:%d:%d [moshpit] %s ", log_host,
		      (int)getpid(), log_rank, names[level]);
	if (level >= MP_LOG_TRACE && n > 0 && (size_t)n < sizeof(msg)) {
		const char *base = strrchr(file, '/');
		n += snprintf(msg + n, sizeof(msg) - (size_t)n, "%s:%d ", base ? base + 1 : file, line);
	}
	va_start(ap, fmt);
	if (n > 0 && (size_t)n < sizeof(msg))
		vsnprintf(msg + n, sizeof(msg) - (size_t)n, fmt, ap);
	va_end(ap);
	if (level == MP_LOG_WARN && n > 0 && (size_t)n < sizeof(msg))
		snprintf(last_warn, sizeof(last_warn), "%s", msg + n);
	/* One fputs per line so lines from concurrent peers do not interleave. */
	n = (int)strlen(msg);
	if (n + 1 < (int)sizeof(msg)) {
		msg[n] = '\n';
		msg[n + 1] = '\0';
	}
	fputs(msg, out);
}

const char *mp_log_last_warn(void)
{
	return last_warn;
}

void mp_log_last_warn_clear(void)
{
	last_warn[0] = '\0';
}
