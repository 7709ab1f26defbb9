"""The boundary between a submission and the grader: what keeps a student's code from changing a grade or a file.

| module  | its one job                                                                                   |
|---------|-----------------------------------------------------------------------------------------------|
| files   | a submission's files copied as data: no link followed, no special file, within limits         |
| sandbox | the boundary a submission's code runs in: bubblewrap, a separate user, or unprotected by name; started   |
| mounts  | the subject's file system under bubblewrap, and what every later grading runs (never writable to it)  |
| separate_user | the separate user: its lookup, the allow-list exposure check as that user, `--fix`, one subject at a time, nothing of it left after one |
| network | the separate user's network closed but loopback (a firewall rule on its uid), or the reason it is not |
| landlock | the subject's own Landlock domain: no process of a submission traces or signals the grader's  |
| watchdog | the limits a submission is held to (memory, processes, disk) and the reason a box was stopped     |
| guard   | without bubblewrap: what a submission changed in the course, put back and named               |
| inbox   | a class's submissions in: through the id door, copied as data, the instructor's times, digests |
| ids     | student ids at the door: the one rule for a name that becomes a folder, a row, a CSV cell     |
| inert   | a submitted notebook made inert, and the pages that show it without script from it (CSP)      |
"""
